"""S3Store against a real S3 API: moto's server on loopback."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from handler.cache import s3 as s3_mod
from handler.cache.errors import ArtifactNotFound, ArtifactVerificationError, StoreUnavailable
from handler.cache.key import CacheKey, sha256_file
from handler.cache.manifest import MANIFEST_NAME
from handler.cache.s3 import S3Store, make_s3_client
from handler.cache.store import blob_name, manifest_name
from handler.cache.sync import PublishOutcome, RestoreOutcome, publish_if_new, restore
from handler.testing.moto import REGION, enforced_auth
from tests.support.artifacts import read_tree, write_artifact

pytestmark = pytest.mark.timeout(60)
FAST = dict(connect_timeout=0.5, read_timeout=0.5, max_attempts=1)


def _object_key(store: S3Store, name: str) -> str:
    return f"{store.prefix}/{name}"


def _leftovers(parent: Path) -> list[str]:
    """Staging or aside dirs left beside dest (the lock file is expected to stay)."""
    return sorted(p.name for p in parent.iterdir() if p.name.startswith(".dest") and p.name != ".dest.lock")


def _count_calls(client: Any, operation: str) -> list[str]:
    calls: list[str] = []  # list.append is atomic: safe from the transfer threads
    client.meta.events.register(f"before-call.s3.{operation}", lambda **kw: calls.append(operation))
    return calls


# ---- round trip and no-clobber


def test_round_trip(s3_store: S3Store, artifact: Path, key: CacheKey, tmp_path: Path, registry):
    assert not s3_store.exists(key)
    assert s3_store.publish(key, artifact).published
    assert s3_store.exists(key)

    result = s3_store.fetch(key, tmp_path / "dest")
    assert result.downloaded and result.files == 4
    assert read_tree(tmp_path / "dest") == read_tree(artifact)
    assert _leftovers(tmp_path) == []
    assert registry.get_sample_value("ts_llm_cache_artifact_downloads_total") == 1


def test_large_files_use_multipart_both_ways(s3_client, bucket, key, tmp_path: Path, monkeypatch):
    # Shrink the thresholds (S3's minimum part is 5 MiB) instead of moving gigabytes.
    monkeypatch.setattr(s3_mod, "MULTIPART_THRESHOLD", 6 << 20)
    monkeypatch.setattr(s3_mod, "PART_BYTES", 5 << 20)
    src = tmp_path / "src"
    src.mkdir()
    (src / "model.so").write_bytes(bytes(range(256)) * (12 << 12))  # 12 MiB: three parts
    calls = _count_calls(s3_client, "CompleteMultipartUpload")
    store = S3Store(bucket, "artifacts", s3_client, progress=True)

    assert store.publish(key, src).published
    assert calls == ["CompleteMultipartUpload"]
    store.fetch(key, tmp_path / "dest")
    assert read_tree(tmp_path / "dest") == read_tree(src)

    # The conditional put holds for a multipart upload too: S3 refuses the completion (412),
    # and the orphaned upload is aborted rather than left to be billed.
    aborts = _count_calls(s3_client, "AbortMultipartUpload")
    loser = S3Store(bucket, "artifacts", s3_client)
    monkeypatch.setattr(loser, "exists", lambda k: False)
    assert not loser.publish(key, src).published
    assert aborts == ["AbortMultipartUpload"]
    assert s3_client.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []


def test_racing_publisher_does_not_clobber(s3_store: S3Store, s3_client, bucket, artifact: Path,
                                           key: CacheKey, tmp_path: Path, monkeypatch):
    """Both publishers checked exists() before either wrote; the second must lose via If-None-Match."""
    s3_store.publish(key, artifact)
    manifest_key = _object_key(s3_store, manifest_name(key.digest()))
    etag = s3_client.head_object(Bucket=bucket, Key=manifest_key)["ETag"]

    loser = S3Store(bucket, "artifacts", s3_client, progress=False)
    monkeypatch.setattr(loser, "exists", lambda k: False)
    assert not loser.publish(key, write_artifact(tmp_path / "other", seed=1)).published

    assert s3_client.head_object(Bucket=bucket, Key=manifest_key)["ETag"] == etag
    s3_store.fetch(key, tmp_path / "dest")
    assert read_tree(tmp_path / "dest") == read_tree(artifact)


def test_publish_if_new_reports_an_existing_artifact(s3_store: S3Store, artifact: Path, key: CacheKey):
    assert publish_if_new(s3_store, key, artifact) is PublishOutcome.PUBLISHED
    assert publish_if_new(s3_store, key, artifact) is PublishOutcome.ALREADY_PRESENT


# ---- corrupted and tampered artifacts


def _assert_rejected(store: S3Store, key: CacheKey, tmp_path: Path, registry, caplog, path: str) -> None:
    with caplog.at_level(logging.ERROR, logger="handler.cache"), pytest.raises(ArtifactVerificationError) as e:
        store.fetch(key, tmp_path / "dest")
    assert e.value.path == path
    assert not (tmp_path / "dest").exists()
    assert _leftovers(tmp_path) == []
    assert registry.get_sample_value("ts_llm_cache_artifacts_rejected_total") == 1
    assert any(r.levelno == logging.ERROR and "REJECTED" in r.getMessage() for r in caplog.records)


def test_corrupted_object_is_rejected(s3_store, s3_client, bucket, artifact, key, tmp_path, registry, caplog):
    s3_store.publish(key, artifact)
    blob = blob_name(key.digest(), sha256_file(artifact / "fxgraph/ab/graph.bin"))
    s3_client.put_object(Bucket=bucket, Key=_object_key(s3_store, blob), Body=b"\x00" * 3000)

    _assert_rejected(s3_store, key, tmp_path, registry, caplog, "fxgraph/ab/graph.bin")
    assert restore(s3_store, key, tmp_path / "dest") is RestoreOutcome.REJECTED
    assert not (tmp_path / "dest").exists()


def test_deleted_object_is_rejected(s3_store, s3_client, bucket, artifact, key, tmp_path, registry, caplog):
    s3_store.publish(key, artifact)
    blob = blob_name(key.digest(), sha256_file(artifact / "index.json"))
    s3_client.delete_object(Bucket=bucket, Key=_object_key(s3_store, blob))

    _assert_rejected(s3_store, key, tmp_path, registry, caplog, "index.json")


def _tamper_manifest(store: S3Store, client: Any, bucket: str, key: CacheKey, edit) -> None:
    name = _object_key(store, manifest_name(key.digest()))
    doc = json.loads(client.get_object(Bucket=bucket, Key=name)["Body"].read())
    client.put_object(Bucket=bucket, Key=name, Body=edit(doc))


def _wrong_hash(doc: dict) -> bytes:
    entry = next(f for f in doc["files"] if f["path"] == "index.json")
    entry["sha256"] = "0" * 64
    return json.dumps(doc).encode()


def _escape(doc: dict) -> bytes:
    doc["files"][0]["path"] = "../escaped.so"
    return json.dumps(doc).encode()


def _other_key(doc: dict) -> bytes:
    doc["key"]["torch_version"] = "2.0.0"
    return json.dumps(doc).encode()


@pytest.mark.parametrize("edit, path", [
    (_wrong_hash, "index.json"),
    (_escape, "../escaped.so"),
    (_other_key, MANIFEST_NAME),
    (lambda doc: b"{ truncated", MANIFEST_NAME),
])
def test_tampered_manifest_is_rejected(s3_store, s3_client, bucket, artifact, key, tmp_path, registry,
                                       caplog, edit, path):
    s3_store.publish(key, artifact)
    _tamper_manifest(s3_store, s3_client, bucket, key, edit)

    _assert_rejected(s3_store, key, tmp_path, registry, caplog, path)
    assert not (tmp_path / "escaped.so").exists()


# ---- broken stores: the server must still start


def test_missing_bucket_says_what_to_fix(s3_client, key, tmp_path: Path, artifact: Path):
    store = S3Store("no-such-bucket", "artifacts", s3_client, progress=False)
    expected = (r"bucket 'no-such-bucket' does not exist at endpoint http://127\.0\.0\.1:\d+: "
                r"create it or fix the bucket in --cache-store s3://BUCKET/PREFIX \(cache_store\)")
    with pytest.raises(StoreUnavailable, match=expected):
        store.exists(key)
    assert restore(store, key, tmp_path / "dest") is RestoreOutcome.STORE_UNAVAILABLE
    assert publish_if_new(store, key, artifact) is PublishOutcome.STORE_UNAVAILABLE


def test_refused_credentials_say_what_to_fix(moto_server: str, s3_store: S3Store, key, tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAUNKNOWNKEY000000")
    client = make_s3_client(moto_server, REGION, **FAST)
    store = S3Store(s3_store.bucket, "artifacts", client, progress=False)
    with enforced_auth(moto_server):
        with pytest.raises(StoreUnavailable, match="credentials refused"):
            store.exists(key)
        assert restore(store, key, tmp_path / "dest") is RestoreOutcome.STORE_UNAVAILABLE


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A loopback port that is bound but not listening: connections are refused, and no one else
    can take the port while the test runs."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A loopback port that accepts connections (kernel backlog) but never answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        yield s.getsockname()[1]


@pytest.mark.parametrize("port_fixture", ["closed_port", "silent_port"])
def test_unreachable_store_means_a_quick_cold_start(request, port_fixture, key, tmp_path: Path, caplog):
    port = request.getfixturevalue(port_fixture)
    store = S3Store("bucket", "artifacts", make_s3_client(f"http://127.0.0.1:{port}", REGION, **FAST))
    start = time.monotonic()
    with caplog.at_level(logging.INFO, logger="handler.cache"):
        outcome = restore(store, key, tmp_path / "dest")
    assert outcome is RestoreOutcome.STORE_UNAVAILABLE
    assert time.monotonic() - start < 5
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("handler.cache")]
    assert len(lines) == 1 and f"cannot reach S3 endpoint http://127.0.0.1:{port}" in lines[0], lines
    assert "--aws-endpoint-url / aws_endpoint_url" in lines[0], lines


def test_wrong_region_names_the_region_flag(s3_client):
    from botocore.exceptions import ClientError

    store = S3Store("bucket", "artifacts", s3_client, progress=False)
    redirect = ClientError({"Error": {"Code": "PermanentRedirect", "Message": "use eu-west-1"},
                            "ResponseMetadata": {"HTTPStatusCode": 301}}, "HeadBucket")
    with pytest.raises(StoreUnavailable, match=r"set --aws-region \(aws_region\) or AWS_DEFAULT_REGION"), store._errors(None):
        raise redirect


# ---- warm path


def test_restore_then_already_local_even_with_the_store_down(s3_store, artifact, key, tmp_path, closed_port):
    s3_store.publish(key, artifact)
    assert restore(s3_store, key, tmp_path / "dest") is RestoreOutcome.RESTORED
    down = S3Store("bucket", "artifacts", make_s3_client(f"http://127.0.0.1:{closed_port}", REGION, **FAST))
    assert restore(down, key, tmp_path / "dest") is RestoreOutcome.ALREADY_LOCAL


@pytest.mark.parametrize("change", [{"torch_version": "2.14.0"}, {"config_digest": "f" * 64}])
def test_changed_key_is_a_miss(s3_store, artifact, make_key, tmp_path, change):
    s3_store.publish(make_key(), artifact)
    assert restore(s3_store, make_key(**change), tmp_path / "dest") is RestoreOutcome.MISS
    assert not (tmp_path / "dest").exists()


def test_unknown_key_is_a_miss(s3_store, key, tmp_path):
    with pytest.raises(ArtifactNotFound):
        s3_store.fetch(key, tmp_path / "dest")


def test_concurrent_workers_download_once(s3_store, s3_client, artifact, key, tmp_path, registry):
    """Four workers start at once; one downloads, the rest wait on the lock and find it in place."""
    workers = 4
    s3_store.publish(key, artifact)
    gets = _count_calls(s3_client, "GetObject")
    barrier = threading.Barrier(workers)
    results: list[bool] = []

    def worker() -> None:
        barrier.wait(timeout=10)
        results.append(s3_store.fetch(key, tmp_path / "dest").downloaded)

    threads = [threading.Thread(target=worker) for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sorted(results) == [False] * (workers - 1) + [True]
    assert len(gets) == 1 + 4  # the manifest, then each file once
    assert registry.get_sample_value("ts_llm_cache_artifact_downloads_total") == 1
    assert read_tree(tmp_path / "dest") == read_tree(artifact)
