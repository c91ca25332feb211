"""LocalStore: the embedded default, a directory (local disk or a shared mount)."""

from __future__ import annotations

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

    def _put_file(self, name: str, src: Path, on_bytes: ByteCallback) -> bool:
        def write(f: BinaryIO) -> None:
            with open(src, "rb") as s:
                copy_chunks(file_chunks(s), f, on_bytes)

        return self._put(name, write)

    def _put_bytes(self, name: str, data: bytes) -> bool:
        return self._put(name, lambda f: f.write(data))

    def _put(self, name: str, write: Callable[[BinaryIO], object]) -> bool:
        with self._errors():
            try:
                with atomic_file(self.root / name, exclusive=True) as f:
                    write(f)
                return True
            except FileExistsError:
                return False

    def _get_file(self, name: str, size: int, dest: Path, on_bytes: ByteCallback) -> None:
        with self._errors():
            src = open(self.root / name, "rb")  # noqa: SIM115 - closed by the with below; only opening maps to store errors
        with src, open(dest, "wb") as d:
            copy_chunks(file_chunks(src), d, on_bytes)

    def _get_bytes(self, name: str) -> bytes:
        with self._errors():
            return (self.root / name).read_bytes()

    def _has(self, name: str) -> bool:
        return (self.root / name).is_file()

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
