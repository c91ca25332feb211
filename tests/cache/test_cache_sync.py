from __future__ import annotations

import fcntl
import logging
import threading
from pathlib import Path

import pytest

from handler.cache.install import install_lock, installed
from handler.cache.key import CacheKey
from handler.cache.local import LocalStore
from handler.cache.sync import PublishOutcome, RestoreOutcome, publish_if_new, restore, restore_in_background


def _lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith("handler.cache")]


def test_miss_is_one_line_and_no_exception(tmp_path: Path, key: CacheKey, caplog):
    with caplog.at_level(logging.INFO, logger="handler.cache"):
        assert restore(LocalStore(tmp_path / "store"), key, tmp_path / "dest") is RestoreOutcome.MISS
    assert len(_lines(caplog)) == 1
    assert "starting cold" in _lines(caplog)[0]


def test_publish_restore_already_local(tmp_path: Path, artifact: Path, key: CacheKey, caplog):
    store = LocalStore(tmp_path / "store")
    assert publish_if_new(store, key, artifact) is PublishOutcome.PUBLISHED
    for expected in (RestoreOutcome.RESTORED, RestoreOutcome.ALREADY_LOCAL):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="handler.cache"):
            assert restore(store, key, tmp_path / "dest") is expected
        assert len(_lines(caplog)) == 1, _lines(caplog)


def test_empty_source_is_a_caller_bug(tmp_path: Path, key: CacheKey):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no files to publish"):
        publish_if_new(LocalStore(tmp_path / "store"), key, tmp_path / "empty")


def test_outcomes_are_plain_strings():
    assert RestoreOutcome.STORE_UNAVAILABLE == "store_unavailable"
    assert PublishOutcome.ALREADY_PRESENT == "already_present"


class GatedStore:
    """A LocalStore whose fetch waits until the test opens the gate."""

    def __init__(self, inner: LocalStore) -> None:
        self.inner, self.gate = inner, threading.Event()

    def describe(self) -> str:
        return self.inner.describe()

    def fetch(self, key: CacheKey, dest_dir: Path):
        assert self.gate.wait(10), "the test never opened the gate"
        return self.inner.fetch(key, dest_dir)


def _lock_is_free(dest: Path) -> bool:
    with open(dest.parent / f".{dest.name}.lock", "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(f, fcntl.LOCK_UN)
        return True


def test_background_restore_holds_the_lock_before_returning(tmp_path: Path, artifact: Path, key: CacheKey):
    store = GatedStore(LocalStore(tmp_path / "store"))
    publish_if_new(store.inner, key, artifact)
    dest = tmp_path / "cache" / "aot"
    outcome = restore_in_background(store, key, dest)
    # What a worker started now sees: the lock is taken, so its lookup waits instead of missing.
    assert not _lock_is_free(dest)
    store.gate.set()
    with install_lock(dest):
        assert installed(dest, key) is not None
    assert outcome.result(timeout=10) is RestoreOutcome.RESTORED
    assert _lock_is_free(dest)


def test_background_restore_miss_releases_the_lock(tmp_path: Path, key: CacheKey):
    dest = tmp_path / "cache" / "aot"
    assert restore_in_background(LocalStore(tmp_path / "store"), key, dest).result(timeout=10) is RestoreOutcome.MISS
    assert _lock_is_free(dest)


def test_background_restore_error_reaches_the_future(tmp_path: Path, key: CacheKey):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(OSError):
        restore_in_background(LocalStore(tmp_path / "store"), key, blocker / "aot").result(timeout=10)


def test_install_lock_is_reentrant_in_one_thread(tmp_path: Path):
    dest = tmp_path / "aot"
    entered = threading.Event()

    def nested() -> None:
        with install_lock(dest), install_lock(dest):
            entered.set()

    thread = threading.Thread(target=nested, daemon=True)
    thread.start()
    assert entered.wait(5), "a nested install_lock in the same thread deadlocked"
    thread.join(5)
    assert _lock_is_free(dest)
