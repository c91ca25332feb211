"""The sidecar's house plan (issue 12): a few rooms at the top, small modules, imports that
only go one way, and no import seams."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SIDECAR = REPO / "handler" / "sidecar"
MAX_LINES = 350


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(SIDECAR.rglob("*.py"))}


def sidecar_imports(path: Path, known: dict[str, Path]) -> set[str]:
    """The handler.sidecar modules `path` imports at module level. `from pkg import module`
    imports that module, not pkg's __init__ (which every submodule runs first anyway)."""
    found: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            submodules = {f"{node.module}.{alias.name}" for alias in node.names} & known.keys()
            names_only = len(submodules) < len(node.names)
            found |= submodules | ({node.module} if names_only else set())
    return found & known.keys()


def test_the_top_level_has_few_entries() -> None:
    entries = [p.name for p in SIDECAR.iterdir() if p.name != "__pycache__"]
    assert len(entries) <= 8, sorted(entries)


def test_no_module_is_over_the_size_limit() -> None:
    long = {name: n for name, path in modules().items()
            if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def test_nothing_imports_through_importlib() -> None:
    users = [name for name, path in modules().items() if "importlib" in path.read_text()]
    assert users == []


def test_module_imports_have_no_cycle() -> None:
    known = modules()
    graph = {name: sidecar_imports(path, known) - {name} for name, path in known.items()}
    done: set[str] = set()

    def visit(name: str, trail: list[str]) -> None:
        if name in trail:
            raise AssertionError(" -> ".join(trail[trail.index(name):] + [name]))
        if name in done:
            return
        for imported in sorted(graph[name]):
            visit(imported, trail + [name])
        done.add(name)

    for name in sorted(graph):
        visit(name, [])
