"""The house plan (docs/architecture.md): small modules, imports that only go one way, no import
seams, a sidecar and an engine with few entries at the top, and TorchServe kept at the edge."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HANDLER = REPO / "handler"
SIDECAR = HANDLER / "sidecar"
ENGINE = HANDLER / "engine"
ARCHITECTURE = REPO / "docs" / "architecture.md"
MAX_LINES = 300
# Where TorchServe may be imported: the handler (its adapter) and the build step that calls
# torch-model-archiver. The engine and the service core stay free of it.
TORCHSERVE_FREE = ("handler.engine", "handler.serving.service", "handler.serving.lifecycle", "handler.serving.protocol", "handler.cache")


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(HANDLER.rglob("*.py"))}


def imports(path: Path) -> set[str]:
    """Every module `path` names in an import statement, at any depth."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found |= {node.module}
    return found


def package_imports(path: Path, known: dict[str, Path]) -> set[str]:
    """The handler modules `path` imports, at any depth: an import inside a function still ties
    the two modules (it only hides the cycle). `from pkg import module` imports that module,
    not pkg's __init__ (which every submodule runs first anyway)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
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


def test_the_engine_top_level_has_few_entries() -> None:
    entries = [p.name for p in ENGINE.iterdir() if p.name != "__pycache__"]
    # 19 with prefill_pace.py; the next module should come with a room for a sequence's tokens
    # (sequence, next_token, sampling, grammar) rather than a higher cap
    assert len(entries) <= 19, sorted(entries)


def test_no_module_is_over_the_size_limit() -> None:
    long = {name: n for name, path in modules().items()
            if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def test_nothing_imports_through_importlib() -> None:
    seams = ("import_module(", "__import__(", "importlib.util")
    users = [name for name, path in modules().items() if any(seam in path.read_text() for seam in seams)]
    assert users == []


def test_the_engine_and_the_service_core_do_not_import_torchserve() -> None:
    users = {name: sorted(m for m in imports(path) if m == "ts" or m.startswith("ts."))
             for name, path in modules().items() if name.startswith(TORCHSERVE_FREE)}
    assert {name: found for name, found in users.items() if found} == {}


def test_module_imports_have_no_cycle() -> None:
    known = modules()
    graph = {name: package_imports(path, known) - {name} for name, path in known.items()}
    done: set[str] = set()

    def visit(name: str, trail: list[str]) -> None:
        if name in trail:
            raise AssertionError(" -> ".join([*trail[trail.index(name):], name]))
        if name in done:
            return
        for imported in sorted(graph[name]):
            visit(imported, [*trail, name])
        done.add(name)

    for name in sorted(graph):
        visit(name, [])


def room(module: str) -> str:
    """The folder (or top-level file) of handler a module lives in: handler.engine.compiled.aot -> engine."""
    return module.split(".")[1]


def documented_rooms() -> dict[str, set[str]]:
    """docs/architecture.md's module map: each room and the rooms it may import."""
    table = {}
    for row in ARCHITECTURE.read_text().splitlines():
        if not row.startswith("| `handler/"):
            continue
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        rooms = [Path(name).stem for name in re.findall(r"`(?:handler/)?([\w.]+)/?`", cells[0])]
        may = {name.strip() for name in re.sub(r"\(.*?\)", "", cells[-1]).split(",")} - {"-", ""}
        table.update(dict.fromkeys(rooms, may))
    return table


def test_every_room_is_in_the_module_map() -> None:
    rooms = {room(name) for name in modules() if name != "handler"}
    assert rooms - documented_rooms().keys() == set()


def test_rooms_import_only_what_the_module_map_allows() -> None:
    allowed = documented_rooms()
    known = modules()
    wrong = sorted(f"{name} imports {imported}" for name, path in known.items() if name != "handler"
                   for imported in package_imports(path, known)
                   if imported != "handler" and room(imported) != room(name)
                   and room(imported) not in allowed.get(room(name), set()))
    assert wrong == []
