"""Installing a downloaded artifact: one downloader at a time, staged, renamed into place.

Layout beside the destination `<parent>/<name>`:
    <parent>/.<name>.lock        flock'ed while checking and installing; never deleted
    <parent>/.<name>.tmp-XXXX/   staging dir, same filesystem, so the final rename is atomic
    <parent>/.<name>.old-XXXX/   the previous dest_dir, moved aside while being replaced
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from handler.cache.check import check_artifact
from handler.cache.key import CacheKey
from handler.cache.manifest import Manifest

_held = threading.local()  # lock files this thread holds: re-entering one is a no-op


@contextmanager
def install_lock(dest_dir: Path) -> Iterator[None]:
    """Exclusive lock shared by every process (and thread) installing into dest_dir.

    Re-entrant within a thread (a restore that holds it across TorchServe's start, see
    handler.cache.sync.restore_in_background, then fetches). The lock file is left behind:
    unlinking it would let a late waiter lock an inode that a newcomer no longer sees. A
    crashed holder releases the lock with its file descriptor.
    """
    dest_dir.parent.mkdir(parents=True, exist_ok=True)
    path = (dest_dir.parent / f".{dest_dir.name}.lock").resolve()
    held = _held.__dict__.setdefault("paths", set())
    if path in held:
        yield
        return
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        held.add(path)
        try:
            yield
        finally:
            held.discard(path)
            fcntl.flock(f, fcntl.LOCK_UN)


@contextmanager
def install_lock_if_free(dest_dir: Path) -> Iterator[bool]:
    """install_lock without waiting: yields whether it was taken (False: another process holds it)."""
    path = (dest_dir.parent / f".{dest_dir.name}.lock").resolve()
    with open(path, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def installed(dest_dir: Path, key: CacheKey) -> Manifest | None:
    """The manifest of the artifact for this key if it is already in place, else None (a damaged
    local copy only means "not installed": fetch again). Sizes, not hashes (handler.cache.check)."""
    checked = check_artifact(dest_dir, key, hashes=False)
    return checked.manifest if checked.verified else None


def clear_leftovers(dest_dir: Path) -> None:
    """Remove staging and aside dirs of installs that crashed; call with the lock held."""
    for pattern in (f".{dest_dir.name}.tmp-*", f".{dest_dir.name}.old-*"):
        for path in dest_dir.parent.glob(pattern):
            shutil.rmtree(path)


@contextmanager
def staging_dir(dest_dir: Path) -> Iterator[Path]:
    """An empty directory beside dest_dir, removed on exit unless it was moved into place."""
    staged = Path(tempfile.mkdtemp(prefix=f".{dest_dir.name}.tmp-", dir=dest_dir.parent))
    try:
        yield staged
    finally:
        shutil.rmtree(staged, ignore_errors=True)


def replace_dir(staged: Path, dest_dir: Path) -> None:
    """Move staged to dest_dir; an older dest_dir is moved aside first, then deleted.

    rename() cannot replace a non-empty directory, so there is a short window with no
    dest_dir at all; a crash there costs one more download, never a half-written artifact.
    """
    old = None
    if dest_dir.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{dest_dir.name}.old-", dir=dest_dir.parent))
        os.rename(dest_dir, old / dest_dir.name)
    os.rename(staged, dest_dir)
    if old is not None:
        shutil.rmtree(old)
