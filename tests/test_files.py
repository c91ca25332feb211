import os

import pytest

from handler.files import atomic_file, write_atomic


def test_write_atomic_replaces_the_whole_file(tmp_path):
    path = tmp_path / "sub" / "record.json"
    write_atomic(path, "old")
    write_atomic(path, b"new")
    assert path.read_bytes() == b"new"
    assert os.listdir(path.parent) == ["record.json"]  # nothing left aside


def test_a_failed_write_leaves_the_old_file_and_no_leftover(tmp_path):
    path = tmp_path / "record.json"
    write_atomic(path, "old")
    with pytest.raises(RuntimeError), atomic_file(path) as f:
        f.write(b"half")
        raise RuntimeError("crashed mid-write")
    assert path.read_text() == "old"
    assert os.listdir(tmp_path) == ["record.json"]


def test_exclusive_never_replaces_an_existing_file(tmp_path):
    path = tmp_path / "blob"
    with atomic_file(path, exclusive=True) as f:
        f.write(b"first")
    with pytest.raises(FileExistsError), atomic_file(path, exclusive=True) as f:
        f.write(b"second")
    assert path.read_bytes() == b"first"
    assert os.listdir(tmp_path) == ["blob"]
