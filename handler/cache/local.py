"""LocalStore: the embedded default, a directory (local disk or a shared mount)."""

from __future__ import annotations

import fcntl
import hashlib
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

from handler.cache.errors import ArtifactNotFound, StoreUnavailable
from handler.cache.progress import ByteCallback, copy_chunks, file_chunks
from handler.cache.store import BlobStore
from handler.files import atomic_file


class LocalStore(BlobStore):
    def __init__(self, root: Path, **kwargs: Any) -> None:
        """kwargs: BlobStore options (metrics, progress, workers)."""
        super().__init__(**kwargs)
        self.root = Path(root)

    def describe(self) -> str:
        return f"local store {self.root}"

    def _put_file(self, name: str, src: Path, on_bytes: ByteCallback, overwrite: bool = False) -> bool:
        def write(f: BinaryIO) -> None:
            with open(src, "rb") as s:
                copy_chunks(file_chunks(s), f, on_bytes)

        return self._put(name, write, exclusive=not overwrite)

    def _put_bytes(self, name: str, data: bytes) -> bool:
        return self._put(name, lambda f: f.write(data))

    def _overwrite_bytes(self, name: str, data: bytes) -> None:
        self._put(name, lambda f: f.write(data), exclusive=False)

    def _replace_bytes(self, name: str, data: bytes, version: str) -> bool:
        # Compare and swap under a lock beside the file: the local twin of S3's If-Match.
        path = self.root / name
        with self._errors(), open(path.parent / f".{path.name}.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                current = self._get_bytes(name)[1]
            except ArtifactNotFound:  # purged since it was read: a plain publish writes it
                return False
            if current != version:
                return False
            return self._put(name, lambda f: f.write(data), exclusive=False)

    def _put(self, name: str, write: Callable[[BinaryIO], object], exclusive: bool = True) -> bool:
        with self._errors():
            try:
                with atomic_file(self.root / name, exclusive=exclusive) as f:
                    write(f)
                return True
            except FileExistsError:
                return False

    def _get_file(self, name: str, size: int, dest: Path, on_bytes: ByteCallback) -> None:
        with self._errors():
            src = open(self.root / name, "rb")  # noqa: SIM115 - closed by the with below; only opening maps to store errors
        with src, open(dest, "wb") as d:
            copy_chunks(file_chunks(src), d, on_bytes)

    def _get_bytes(self, name: str) -> tuple[bytes, str]:
        with self._errors():
            data = (self.root / name).read_bytes()
        return data, hashlib.sha256(data).hexdigest()

    def _version(self, name: str) -> str | None:
        try:
            return self._get_bytes(name)[1]
        except ArtifactNotFound:
            return None

    def _list(self, prefix: str) -> list[tuple[str, float]]:
        folder, _, start = prefix.rpartition("/")
        with self._errors():
            try:
                entries = list(os.scandir(self.root / folder))
            except FileNotFoundError:  # nothing was ever written there
                return []
        return [(f"{folder}/{e.name}" if folder else e.name, e.stat().st_mtime) for e in entries
                if e.is_file() and e.name.startswith(start) and not e.name.startswith(".")]

    def _delete(self, name: str) -> None:
        with self._errors():
            (self.root / name).unlink(missing_ok=True)

    @contextmanager
    def _errors(self) -> Iterator[None]:
        try:
            yield
        except FileNotFoundError as e:
            raise ArtifactNotFound(f"{e.filename} not found in {self.describe()}") from e
        except PermissionError as e:
            raise StoreUnavailable(f"{self.describe()} is not accessible ({e}): fix its permissions "
                                   "or point --cache-store (cache_store) at a directory this "
                                   "process may read and write") from e
