"""The C++ build products an AOT artifact carries, so a loading worker compiles nothing.

Serialized Inductor graphs hold their CPU kernels as C++ source. Loading them in a fresh
container would compile every kernel (~30 s on 2 cores) and Inductor's precompiled prefix header
(~5 s: it is built eagerly, even when every kernel already exists). Both are keyed by content and
compiler command line, so the files built at compile time are valid wherever the key matches:
the same torch, CPU features and (for the kernels) install paths.

    kernels/<xx>/<key>.so, <key>.*.o   Inductor's kernel cache layout (under TORCHINDUCTOR_CACHE_DIR)
    headers/<hash>.h, <hash>.h.gch.gz  its precompiled header dir (under the temp dir), gzipped

The header dir is a private module constant of torch._inductor.codecache (torch is pinned and
in the cache key); without it the header is not carried, which costs load time, not correctness.
"""
from __future__ import annotations

import gzip
import logging
import shutil
import tempfile
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from handler.files import atomic_file

log = logging.getLogger(__name__)

KERNEL_DIR = "kernels"
HEADER_DIR = "headers"


@contextmanager
def private_build_dirs() -> Iterator[Path]:
    """Point Inductor's kernel cache and header dir at empty dirs for the duration, so what is
    built inside is exactly this compile's (pack() takes it): its kernels, its precompiled
    header and, in a process that has not compiled before (a worker, archive.sh), the CPU
    feature probes a loading worker would otherwise compile. Removed on exit: loaded libraries
    stay mapped."""
    with tempfile.TemporaryDirectory(prefix="ts-llm-aot-") as tmp, build_dirs(Path(tmp)) as path:
        yield path


@contextmanager
def build_dirs(path: Path) -> Iterator[Path]:
    """Point Inductor's kernel cache and header dir at `path` for the duration: private_build_dirs,
    and the processes that compile graphs of the same artifact beside it (side_by_side), so
    that they build one precompiled header between them (~5 s each otherwise), packed with the rest."""
    from torch._inductor.runtime.cache_dir_utils import temporary_cache_dir

    with temporary_cache_dir(str(path)), _header_dir(path / HEADER_DIR):
        yield path


@contextmanager
def _header_dir(path: Path) -> Iterator[None]:
    codecache = _codecache_with_header_dir()
    if codecache is None:
        log.warning("aot: this torch has no precompiled-header dir to redirect; the artifact will not carry "
                    "the header and a loading worker builds it (~5 s)")
        yield
        return
    saved = codecache._HEADER_DIR, codecache._HEADER_LOCK_DIR
    codecache._HEADER_DIR, codecache._HEADER_LOCK_DIR = str(path), str(path / "locks")
    codecache._precompile_header.cache_clear()  # it remembers headers built elsewhere
    try:
        yield
    finally:
        codecache._HEADER_DIR, codecache._HEADER_LOCK_DIR = saved
        codecache._precompile_header.cache_clear()


def _codecache_with_header_dir():
    from torch._inductor import codecache

    needed = ("_HEADER_DIR", "_HEADER_LOCK_DIR", "_precompile_header")
    return codecache if all(hasattr(codecache, n) for n in needed) else None


# ---- pack and install -------------------------------------------------------------------------

def pack(build_dir: Path, dest: Path) -> dict[str, list[str]]:
    """Copy the kernel libraries and precompiled headers built under build_dir into dest;
    returns their names relative to dest (the artifact index records them)."""
    kernels = [_copy(built, build_dir, dest, KERNEL_DIR) for built in _built_files(Path(build_dir))]

    def pack_header(header: Path) -> str:
        if header.suffix != ".gch":
            return _copy(header, build_dir / HEADER_DIR, dest, HEADER_DIR)
        target = dest / HEADER_DIR / (header.name + ".gz")  # ~150 MB that gzip -1 shrinks about 6x
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(header, "rb") as src, gzip.open(target, "wb", compresslevel=1) as out:
            shutil.copyfileobj(src, out, 1 << 20)
        return f"{HEADER_DIR}/{target.name}"

    return {"kernels": kernels, "headers": _each(pack_header, sorted((build_dir / HEADER_DIR).glob("*.h*")))}


def _each(fn: Callable[[Path], Any], paths: list[Path]) -> list[Any]:
    """fn of each path, in threads: (de)compressing the headers (0.6-0.9 s each) is zlib's work,
    which lets go of the GIL, and a cold start waits for it."""
    with ThreadPoolExecutor(max(1, len(paths))) as pool:
        return list(pool.map(fn, paths))


def _copy(path: Path, root: Path, dest: Path, folder: str) -> str:
    rel = f"{folder}/{path.relative_to(root).as_posix()}"
    (dest / rel).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(path, dest / rel)
    return rel


def install_kernels(src: Path, packed: dict[str, list[str]]) -> int:
    """Put packed files where Inductor looks for them; files already there are kept (same name,
    same content key). Each lands by rename, so a concurrent worker never reads half a file.
    Returns how many were installed."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    count = 0
    for rel in packed["kernels"]:
        count += _place(src / rel, Path(cache_dir()) / Path(rel).relative_to(KERNEL_DIR), gunzip=False)
    codecache = _codecache_with_header_dir()
    if codecache is not None:
        def place_header(rel: Path) -> int:
            return _place(src / rel, Path(codecache._HEADER_DIR) / rel.name.removesuffix(".gz"), gunzip=rel.suffix == ".gz")

        count += sum(_each(place_header, [Path(rel) for rel in packed["headers"]]))
    return count


def _place(src: Path, target: Path, gunzip: bool) -> int:
    if target.exists():
        return 0
    with atomic_file(target) as out, (gzip.open(src, "rb") if gunzip else open(src, "rb")) as f:
        shutil.copyfileobj(f, out, 1 << 20)
    return 1


def inductor_cache_dir() -> str:
    """Inductor's kernel cache dir now (a private build dir inside private_build_dirs)."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return cache_dir()


def compiled_libraries() -> set[Path]:
    """The kernel libraries and objects in Inductor's cache now (to tell what a load had to compile)."""
    return set(_built_files(Path(inductor_cache_dir())))


def _built_files(cache: Path) -> list[Path]:
    # Libraries, and the objects a separately built C++ wrapper links (`<key>.main.o`,
    # `<key>.optimized.o`): Inductor checks each build step's output before running it, so
    # without the objects a load compiles them again (seconds a graph) only to find the library there.
    return sorted([*cache.glob("*/*.so"), *cache.glob("*/*.o")])
