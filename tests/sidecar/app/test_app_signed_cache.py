"""The sidecar's restore and publish with fleet keys and a bad stored artifact, through
`ts-llm-sidecar` against moto's S3 server: a forged manifest is refused, and the replica that
refused it replaces it with what it compiled."""
from __future__ import annotations

import json
import logging
from pathlib import Path

import boto3
import pytest

from handler.cache.key import sha256_file
from handler.cache.signing import generate_key_pair
from handler.cache.store import blob_name, manifest_name
from handler.sidecar.app import wiring
from handler.sidecar.app.cli import main
from handler.sidecar.config import config_from_mapping
from handler.sidecar.errors import ConfigError

from ..conftest import install_artifact

pytestmark = pytest.mark.timeout(60)
BUCKET = "fleet-cache"


@pytest.fixture
def s3(moto: str):
    client = boto3.client("s3", endpoint_url=moto, region_name="us-east-1")
    client.create_bucket(Bucket=BUCKET)
    return client


@pytest.fixture
def keys(tmp_path: Path) -> dict[str, str]:
    generate_key_pair(tmp_path / "fleet.pem", tmp_path / "fleet.pub")
    return {"--cache-signing-key": str(tmp_path / "fleet.pem"), "--cache-public-key": str(tmp_path / "fleet.pub")}


def _cli(command: str, moto: str, cache_dir: Path, key_file: Path, **flags: str) -> int:
    argv = [command, "--cache-store", f"s3://{BUCKET}/artifacts", "--cache-dir", str(cache_dir),
            "--cache-key", str(key_file), "--aws-endpoint-url", moto, "--aws-region", "us-east-1"]
    return main(argv + [item for pair in flags.items() for item in pair])


def _record(cache_dir: Path) -> dict:
    return json.loads((cache_dir.parent / f".{cache_dir.name}.restore.json").read_text())


def _manifest_etag(s3, key) -> str:
    return s3.head_object(Bucket=BUCKET, Key=f"artifacts/{manifest_name(key.digest())}")["ETag"]


@pytest.mark.parametrize("damage", ["corrupted-blob", "unsigned-manifest"])
def test_a_rejected_artifact_is_replaced_by_the_replica_that_compiled_it(
        moto: str, s3, keys: dict[str, str], tmp_path: Path, damage: str, caplog) -> None:
    key = install_artifact(tmp_path / "a")
    key_file = tmp_path / "a" / "cache-key.json"
    if damage == "corrupted-blob":
        assert _cli("publish", moto, tmp_path / "a", key_file, **keys) == 0
        blob = blob_name(key.digest(), sha256_file(tmp_path / "a" / "a.bin"))
        s3.put_object(Bucket=BUCKET, Key=f"artifacts/{blob}", Body=b"\x00" * 600)
    else:  # a writer of the bucket without the fleet key: valid hashes, no signature
        assert _cli("publish", moto, tmp_path / "a", key_file) == 0
    rejected = _manifest_etag(s3, key)

    b = tmp_path / "cache" / "aot"
    assert _cli("restore", moto, b, key_file, **keys) == 0
    record = _record(b)
    assert (record["outcome"], record["rejected"], record["rejected_version"]) == ("rejected", 1, rejected)
    assert record["signature_rejected"] == (damage == "unsigned-manifest")

    install_artifact(b, key)  # its cold compile (the same bytes here: the same manifest, the same ETag)
    with caplog.at_level(logging.INFO, logger="handler.sidecar"):
        assert _cli("publish", moto, b, b / "cache-key.json", **keys) == 0
    assert "cache publish: replaced" in caplog.text
    c = tmp_path / "c"
    assert _cli("restore", moto, c, key_file, **keys) == 0
    assert _record(c)["outcome"] == "restored"
    assert (c / "a.bin").read_bytes() == (b / "a.bin").read_bytes()

    # Nothing replaces the valid, signed artifact: not another publish, not a stale record.
    replaced = _manifest_etag(s3, key)
    assert _cli("publish", moto, b, b / "cache-key.json", **keys) == 0
    assert _manifest_etag(s3, key) == replaced


def test_a_pod_with_the_public_key_only_does_not_publish(moto: str, s3, keys: dict[str, str], tmp_path: Path,
                                                         caplog) -> None:
    install_artifact(tmp_path / "a")
    public_only = {"--cache-public-key": keys["--cache-public-key"]}
    assert _cli("publish", moto, tmp_path / "a", tmp_path / "a" / "cache-key.json", **public_only) == 2
    assert s3.list_objects_v2(Bucket=BUCKET).get("KeyCount") == 0
    config = config_from_mapping({"cache_store": f"s3://{BUCKET}/x", "cache_dir": str(tmp_path / "a"),
                                  "cache_public_key": keys["--cache-public-key"], "aws_endpoint_url": moto})
    with caplog.at_level(logging.WARNING):
        assert wiring.config_publisher(config) is None
    assert "this pod verifies artifacts and does not publish" in caplog.text


def test_a_store_without_a_public_key_is_announced_as_hash_checked_only(moto: str, s3, tmp_path: Path,
                                                                       caplog) -> None:
    with caplog.at_level(logging.WARNING):
        assert _cli("restore", moto, tmp_path / "b", tmp_path / "none.json") == 0
    assert "no cache_public_key" in caplog.text and "ONLY hash-checked" in caplog.text


def test_a_key_file_that_is_not_a_key_is_a_config_error(moto: str, s3, tmp_path: Path) -> None:
    (tmp_path / "not-a-key.pem").write_text("hello")
    assert _cli("restore", moto, tmp_path / "b", tmp_path / "none.json",
                **{"--cache-public-key": str(tmp_path / "not-a-key.pem")}) == 2
    with pytest.raises(ConfigError, match="need cache_store"):
        config_from_mapping({"cache_public_key": str(tmp_path / "not-a-key.pem")})
