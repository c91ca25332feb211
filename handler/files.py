"""Atomic file writes: a reader sees the old file or the whole new one, never half of one."""
from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO


@contextlib.contextmanager
def atomic_file(path: Path, exclusive: bool = False) -> Iterator[BinaryIO]:
    """A file to write that appears at `path` when the block ends without an error.

    It is written aside in path's own directory (one filesystem: the final step is a rename)
    and flushed to disk first, so a file that names others (a manifest) never outlives them.
    exclusive: never replace an existing `path` (FileExistsError instead): link() refuses an
    existing name, the local twin of S3's If-None-Match: *."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        if exclusive:
            os.link(tmp, path)
        else:
            os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):  # gone after replace(); left after link()
            os.unlink(tmp)


def write_atomic(path: Path, data: bytes | str) -> None:
    """Replace `path` with `data` (text is written as UTF-8) atomically."""
    with atomic_file(path) as f:
        f.write(data.encode() if isinstance(data, str) else data)
