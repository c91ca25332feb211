"""Moving bytes with a progress bar, shown only for large transfers to a terminal."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import BinaryIO

from tqdm import tqdm

PROGRESS_MIN_BYTES = 16 * 1024 * 1024
CHUNK_BYTES = 1 << 20
ByteCallback = Callable[[int], None]


def _ignore(n: int) -> None:
    pass


@contextmanager
def byte_progress(total: int, desc: str, enabled: bool = True) -> Iterator[ByteCallback]:
    """Yield a thread-safe callback taking the number of bytes just transferred."""
    if not enabled or total <= PROGRESS_MIN_BYTES:
        yield _ignore
        return
    # disable=None: no bar when stderr is not a TTY, e.g. inside TorchServe's worker logs.
    with tqdm(total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024,
              disable=None, leave=False) as bar:
        lock = threading.Lock()  # transfers run on a thread pool; tqdm's counter is not atomic

        def update(n: int) -> None:
            with lock:
                bar.update(n)

        yield update


def copy_chunks(chunks: Iterable[bytes], dest: BinaryIO, on_bytes: ByteCallback) -> None:
    for chunk in chunks:
        dest.write(chunk)
        on_bytes(len(chunk))


def file_chunks(f: BinaryIO, size: int = CHUNK_BYTES) -> Iterator[bytes]:
    while chunk := f.read(size):
        yield chunk
