"""handler.testing holds test doubles; the product must never import them. A serving or spot
path that imported the metadata emulator would ship a fake cloud into production."""

from __future__ import annotations

import ast
from pathlib import Path

HANDLER = Path(__file__).resolve().parents[2] / "handler"
TESTING = HANDLER / "testing"


def imported_modules(source: str, package: tuple[str, ...]) -> list[str]:
    """Every module `source` imports (and every name it imports from one, which may be a
    module), relative imports resolved against `package`, the importing module's package."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = list(package[:len(package) - node.level + 1]) if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            found += [module] + [f"{module}.{alias.name}" for alias in node.names]
    return found


def product_files() -> list[Path]:
    return [path for path in sorted(HANDLER.rglob("*.py")) if TESTING not in path.parents]


def imports_of(path: Path) -> list[str]:
    package = path.relative_to(HANDLER.parent).with_suffix("").parts[:-1]
    return imported_modules(path.read_text(), package)


def test_the_scan_sees_the_product() -> None:
    names = {path.relative_to(HANDLER).as_posix() for path in product_files()}
    assert {"sidecar/app/sidecar.py", "serve.py", "http_server.py"} <= names


def test_no_product_module_imports_handler_testing() -> None:
    offenders = [f"{path.relative_to(HANDLER.parent)} imports {name}"
                 for path in product_files() for name in imports_of(path)
                 if name == "handler.testing" or name.startswith("handler.testing.")]
    assert offenders == []


def test_the_scan_resolves_relative_imports() -> None:
    # `from ..testing import x` in handler/sidecar/*.py must not slip past the scan.
    names = imported_modules("from ..testing import metadata_emulator", ("handler", "sidecar"))
    assert "handler.testing.metadata_emulator" in names
