from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest

from handler.cache.errors import ArtifactNotFound, ArtifactVerificationError, StoreUnavailable
from handler.cache.key import CacheKey, sha256_file
from handler.cache.local import LocalStore
from handler.cache.manifest import MANIFEST_NAME
from handler.cache.store import blob_name
from tests.support.artifacts import read_tree, write_artifact

WORKERS = 3


def test_round_trip(tmp_path: Path, artifact: Path, key: CacheKey, metrics):
    store = LocalStore(tmp_path / "store", metrics=metrics)
    assert not store.exists(key)
    published = store.publish(key, artifact)
    assert published.published and published.files == 4
    assert store.exists(key)

    result = store.fetch(key, tmp_path / "dest")
    assert result.downloaded and result.files == 4
    assert read_tree(tmp_path / "dest") == read_tree(artifact)
    assert (tmp_path / "dest" / MANIFEST_NAME).is_file()


def test_identical_files_are_stored_once(tmp_path: Path, artifact: Path, key: CacheKey):
    store = LocalStore(tmp_path / "store")
    store.publish(key, artifact)
    assert len(list((tmp_path / "store" / key.digest() / "blobs").iterdir())) == 3


def test_second_publish_does_not_clobber(tmp_path: Path, artifact: Path, key: CacheKey, monkeypatch):
    """A racing publisher with different bytes (compiles are not reproducible) must lose cleanly."""
    store = LocalStore(tmp_path / "store")
    store.publish(key, artifact)
    loser = LocalStore(tmp_path / "store")
    monkeypatch.setattr(loser, "exists", lambda k: False)  # both checked before either wrote
    assert not loser.publish(key, write_artifact(tmp_path / "other", seed=1)).published

    store.fetch(key, tmp_path / "dest")
    assert read_tree(tmp_path / "dest") == read_tree(artifact)


def test_fetch_of_unknown_key_is_a_miss(tmp_path: Path, key: CacheKey):
    with pytest.raises(ArtifactNotFound):
        LocalStore(tmp_path / "store").fetch(key, tmp_path / "dest")
    assert not (tmp_path / "dest").exists()


def test_fetch_replaces_a_stale_destination(tmp_path: Path, artifact: Path, make_key):
    store = LocalStore(tmp_path / "store")
    old, new = make_key(config_digest="old"), make_key(config_digest="new")
    store.publish(old, write_artifact(tmp_path / "old", seed=1))
    store.publish(new, artifact)
    store.fetch(old, tmp_path / "dest")

    assert store.fetch(new, tmp_path / "dest").downloaded
    assert read_tree(tmp_path / "dest") == read_tree(artifact)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".dest")) == [".dest.lock"]


def test_corrupted_blob_is_rejected_and_never_installed(tmp_path: Path, artifact: Path, key: CacheKey,
                                                        metrics, registry):
    store = LocalStore(tmp_path / "store", metrics=metrics)
    store.publish(key, artifact)
    blob = tmp_path / "store" / blob_name(key.digest(), sha256_file(artifact / "index.json"))
    blob.write_bytes(b'{"seed": 9}')  # same size, other bytes

    with pytest.raises(ArtifactVerificationError, match=r"index\.json"):
        store.fetch(key, tmp_path / "dest")
    assert not (tmp_path / "dest").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".dest")] == [".dest.lock"]
    assert registry.get_sample_value("ts_llm_cache_artifacts_rejected_total") == 1


def _fetch_in_process(root: Path, key: CacheKey, dest: Path, barrier, results) -> None:
    barrier.wait(timeout=30)
    results.put(LocalStore(root).fetch(key, dest).downloaded)


def test_concurrent_processes_download_once(tmp_path: Path, artifact: Path, key: CacheKey):
    """Workers started together share one download: the others wait on the lock, then find it."""
    store = LocalStore(tmp_path / "store")
    store.publish(key, artifact)
    ctx = multiprocessing.get_context("spawn")  # fork is unsafe with the threads pytest may run
    barrier, results = ctx.Barrier(WORKERS), ctx.Queue()
    procs = [ctx.Process(target=_fetch_in_process, args=(tmp_path / "store", key, tmp_path / "dest",
                                                          barrier, results)) for _ in range(WORKERS)]
    for p in procs:
        p.start()
    downloaded = sorted(results.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    assert downloaded == [False] * (WORKERS - 1) + [True]
    assert read_tree(tmp_path / "dest") == read_tree(artifact)


def test_fetch_clears_staging_left_by_a_crashed_worker(tmp_path: Path, artifact: Path, key: CacheKey):
    store = LocalStore(tmp_path / "store")
    store.publish(key, artifact)
    (tmp_path / ".dest.tmp-deadbeef" / "half").mkdir(parents=True)
    store.fetch(key, tmp_path / "dest")
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".dest")] == [".dest.lock"]


def test_unreadable_store_names_the_setting_to_change(tmp_path: Path, key: CacheKey,
                                                      monkeypatch: pytest.MonkeyPatch):
    store = LocalStore(tmp_path / "store")
    (tmp_path / "store").mkdir()

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied", str(tmp_path / "store"))

    # Tests may run as root, where chmod refuses nothing; refuse at the syscall instead.
    monkeypatch.setattr("tempfile.mkstemp", refuse)
    with pytest.raises(StoreUnavailable, match=r"point --cache-store \(cache_store\) at a directory"):
        store._put_bytes("x", b"1")
