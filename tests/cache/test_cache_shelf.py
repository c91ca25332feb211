"""The shelf of compile artifacts: one folder per key, least recently used out beyond its bound,
never one whose lock another process holds."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from handler.cache import shelf


def _artifact(root: Path, name: str, size: int, used: float) -> Path:
    path = root / name
    path.mkdir(parents=True)
    (path / "graphs.bin").write_bytes(b"x" * size)
    os.utime(path, (used, used))
    return path


def test_an_artifact_folder_is_named_by_its_key_digest(tmp_path):
    assert shelf.key_dir(tmp_path, "0123456789abcdef" * 4) == tmp_path / "0123456789abcdef"


def test_the_least_recently_used_go_first_until_the_shelf_fits(tmp_path):
    now = time.time()
    old, older, newest = (_artifact(tmp_path, f"{i:016x}", 100, now - age) for i, age in ((1, 10), (2, 20), (3, 0)))
    removed = shelf.evict(tmp_path, limit_bytes=250, keep=newest)
    assert removed == [older] and old.is_dir() and newest.is_dir() and not older.exists()


def test_the_artifact_kept_stays_whatever_its_size(tmp_path):
    keep = _artifact(tmp_path, "a" * 16, 1000, time.time() - 100)
    other = _artifact(tmp_path, "b" * 16, 10, time.time())
    assert shelf.evict(tmp_path, limit_bytes=100, keep=keep) == [other]
    assert keep.is_dir()


def test_touch_makes_an_artifact_the_most_recently_used(tmp_path):
    first = _artifact(tmp_path, "a" * 16, 100, time.time() - 100)
    second = _artifact(tmp_path, "b" * 16, 100, time.time() - 50)
    keep = _artifact(tmp_path, "c" * 16, 100, time.time())
    shelf.touch(first)
    assert shelf.evict(tmp_path, limit_bytes=200, keep=keep) == [second]


def test_an_artifact_locked_by_another_process_is_skipped(tmp_path):
    locked = _artifact(tmp_path, "a" * 16, 100, time.time() - 100)
    keep = _artifact(tmp_path, "b" * 16, 100, time.time())
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; from handler.cache.install import install_lock\n"
         f"with install_lock(Path({str(locked)!r})):\n    print('held', flush=True); time.sleep(30)"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert shelf.evict(tmp_path, limit_bytes=100, keep=keep) == []
        assert locked.is_dir()
    finally:
        holder.kill()
        holder.wait()
    assert shelf.evict(tmp_path, limit_bytes=100, keep=keep) == [locked]


def test_other_folders_and_files_are_not_the_shelfs(tmp_path):
    keep = _artifact(tmp_path, "a" * 16, 10, time.time())
    (tmp_path / "notes").mkdir()
    (tmp_path / "graphs.json").write_text("{}")  # a single artifact's files from before the shelf
    assert shelf.evict(tmp_path, limit_bytes=0, keep=keep) == []
    assert (tmp_path / "notes").is_dir() and (tmp_path / "graphs.json").is_file()
