"""A shelf of compile artifacts, one per cache key, bounded in size: least recently used out.

Where several models share a host (TorchServe serves many .mar files), the user's cache directory
holds each model's artifact in a folder of its own, so serving one never replaces another's:

    <root>/<key digest, 16 hex>/    one verified artifact (installed and read as any cache dir)
    <root>/.<digest>.lock           its install lock (handler.cache.install)

A load or an install touches the folder (its mtime is its last use); after an install the
least recently used others go until the shelf fits its bound. A folder whose lock another
process holds (installing or loading it) is skipped, never removed under it."""
from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

from handler.cache.install import install_lock_if_free

log = logging.getLogger(__name__)

DIGEST_CHARS = 16


def key_dir(root: Path, digest: str) -> Path:
    return root / digest[:DIGEST_CHARS]


def touch(artifact: Path) -> None:
    """Mark an artifact used now."""
    os.utime(artifact)


def evict(root: Path, limit_bytes: int, keep: Path) -> list[Path]:
    """Remove the least recently used artifacts beside `keep` until the shelf holds at most
    limit_bytes (`keep` itself stays, whatever its size); returns what was removed."""
    others = [p for p in _artifacts(root) if p != keep]
    sizes = {p: _size(p) for p in others}
    total = sum(sizes.values()) + (_size(keep) if keep.is_dir() else 0)
    removed = []
    for path in sorted(others, key=lambda p: p.stat().st_mtime):
        if total <= limit_bytes:
            break
        with install_lock_if_free(path) as locked:
            if not locked:
                continue
            shutil.rmtree(path)
        total -= sizes[path]
        removed.append(path)
        log.info("compile cache: removed %s (%.0f MB, least recently used) to keep %s under %.0f MB", path.name,
                 sizes[path] / 1e6, root, limit_bytes / 1e6)
    return removed


def _artifacts(root: Path) -> list[Path]:
    if not root.is_dir():
        return []
    return [p for p in root.iterdir() if p.is_dir() and len(p.name) == DIGEST_CHARS and not p.name.startswith(".")]


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())
