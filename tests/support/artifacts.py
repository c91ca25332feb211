"""Small artifact trees for cache tests."""

from __future__ import annotations

from pathlib import Path

from handler.cache.manifest import MANIFEST_NAME


def write_artifact(root: Path, seed: int = 0) -> Path:
    """A small compile-cache-like tree; `seed` changes every file's content."""
    files = {
        "fxgraph/ab/graph.bin": bytes((i * 7 + seed) % 256 for i in range(3000)),
        "triton/kernel_0/kernel.so": f"kernel {seed}".encode() * 100,
        "triton/kernel_1/kernel.so": f"kernel {seed}".encode() * 100,  # identical: stored once
        "index.json": f'{{"seed": {seed}}}'.encode(),
    }
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


def read_tree(root: Path) -> dict[str, bytes]:
    """Relative path -> content of every file, the installed manifest copy excluded."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != MANIFEST_NAME}
