"""A rejected stored artifact is replaced by a fresh one, and nothing else ever is.

Against a real S3 API (moto's server: If-Match on put_object) and the local store."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from handler.cache.errors import ArtifactVerificationError
from handler.cache.key import CacheKey, sha256_file
from handler.cache.local import LocalStore
from handler.cache.s3 import S3Store
from handler.cache.store import BlobStore, blob_name, manifest_name
from handler.cache.sync import PublishOutcome, publish_if_new
from tests.support.artifacts import read_tree, write_artifact

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(params=["s3", "local"])
def make_store(request, bucket: str, s3_client: Any, tmp_path: Path, metrics):
    """Stores over one backend (each a replica), the first counting in `metrics`."""
    def make(counted: bool = False) -> BlobStore:
        kw = {"metrics": metrics} if counted else {}
        if request.param == "s3":
            return S3Store(bucket, "artifacts", s3_client, progress=False, **kw)
        return LocalStore(tmp_path / "store", progress=False, **kw)

    return make


def _corrupt(store: BlobStore, s3_client: Any, artifact: Path, key: CacheKey) -> None:
    name = blob_name(key.digest(), sha256_file(artifact / "fxgraph/ab/graph.bin"))
    if isinstance(store, S3Store):
        s3_client.put_object(Bucket=store.bucket, Key=f"{store.prefix}/{name}", Body=b"\x00" * 3000)
    else:
        assert isinstance(store, LocalStore)
        (store.root / name).write_bytes(b"\x00" * 3000)


def _version(store: BlobStore, key: CacheKey) -> str | None:
    return store._version(manifest_name(key.digest()))


def test_a_replica_that_rejected_an_artifact_replaces_it_with_its_own(
        make_store, s3_client, artifact: Path, key: CacheKey, tmp_path: Path, registry):
    make_store().publish(key, artifact)
    replica = make_store(counted=True)
    _corrupt(replica, s3_client, artifact, key)
    with pytest.raises(ArtifactVerificationError):
        replica.fetch(key, tmp_path / "rejected")
    rejected = replica.rejected_version(key)
    assert rejected == _version(replica, key)

    # It compiles the key itself: same files here, so the damaged blob's name is shared too.
    fresh = write_artifact(tmp_path / "fresh")
    assert publish_if_new(replica, key, fresh, replace=rejected) is PublishOutcome.REPLACED
    assert registry.get_sample_value("ts_llm_cache_artifacts_replaced_total") == 1
    assert registry.get_sample_value("ts_llm_cache_artifacts_rejected_total") == 1

    make_store().fetch(key, tmp_path / "next")  # the next replica starts warm
    assert read_tree(tmp_path / "next") == read_tree(fresh)


def test_a_valid_artifact_is_never_replaced(make_store, artifact: Path, key: CacheKey, tmp_path: Path):
    make_store().publish(key, artifact)
    valid = _version(make_store(), key)
    other = write_artifact(tmp_path / "other", seed=3)
    assert publish_if_new(make_store(), key, other) is PublishOutcome.ALREADY_PRESENT
    # A replica that rejected an older version: another one has replaced it since.
    assert publish_if_new(make_store(), key, other, replace="an-older-version") is PublishOutcome.ALREADY_PRESENT
    assert _version(make_store(), key) == valid
    make_store().fetch(key, tmp_path / "dest")
    assert read_tree(tmp_path / "dest") == read_tree(artifact)


def test_two_replicas_that_rejected_the_same_artifact_replace_it_once(
        make_store, s3_client, artifact: Path, key: CacheKey, tmp_path: Path, monkeypatch):
    make_store().publish(key, artifact)
    first, second = make_store(), make_store()
    _corrupt(first, s3_client, artifact, key)
    rejected = _version(first, key)
    assert rejected is not None
    first_fresh = write_artifact(tmp_path / "first", seed=1)
    assert publish_if_new(first, key, first_fresh, replace=rejected) is PublishOutcome.REPLACED
    # The second read the stored version before the first replaced it: its conditional write loses.
    monkeypatch.setattr(second, "_version", lambda name: rejected)
    assert second.publish(key, write_artifact(tmp_path / "second", seed=2), replace=rejected).published is False
    make_store().fetch(key, tmp_path / "dest")
    assert read_tree(tmp_path / "dest") == read_tree(first_fresh)
