"""Signed manifests: a writer of the store without the fleet key cannot get code loaded.

Against a real S3 API (moto's server): a forged artifact with valid SHA-256s, signed by
another key or not at all, is refused before anything it names is downloaded."""

from __future__ import annotations

import logging
import stat
from pathlib import Path
from typing import Any

import pytest

from handler.cache.errors import ManifestSignatureError, SigningKeyError
from handler.cache.key import CacheKey
from handler.cache.s3 import S3Store
from handler.cache.signing import ManifestSigner, ManifestVerifier, Signing, generate_key_pair, unverified_body
from handler.cache.store import manifest_name
from handler.cache.sync import RestoreOutcome, restore
from tests.support.artifacts import read_tree, write_artifact

pytestmark = pytest.mark.timeout(60)


def _key_pair(tmp_path: Path, name: str) -> tuple[ManifestSigner, ManifestVerifier]:
    private, public = tmp_path / f"{name}.pem", tmp_path / f"{name}.pub.pem"
    generate_key_pair(private, public)
    return ManifestSigner.from_file(private), ManifestVerifier.from_file(public)


@pytest.fixture
def fleet(tmp_path: Path) -> tuple[ManifestSigner, ManifestVerifier]:
    return _key_pair(tmp_path, "fleet")


# ---- the envelope


def test_a_signed_manifest_opens_with_its_public_key_only(tmp_path: Path, fleet):
    signer, verifier = fleet
    stored = signer.sign(b'{"files": []}')
    assert verifier.open(stored) == b'{"files": []}'
    assert unverified_body(stored) == b'{"files": []}', "a store with no public key still reads it"
    _, other = _key_pair(tmp_path, "other")
    with pytest.raises(ManifestSignatureError, match=f"does not verify with key {other.key_id}"):
        other.open(stored)


@pytest.mark.parametrize("stored", [
    pytest.param(b'{"files": []}', id="unsigned"),
    pytest.param(b"ts-llm-manifest-signature/1 ed25519 abc !!!\n{}", id="not-base64"),
    pytest.param(b"ts-llm-manifest-signature/1 rsa abc AAAA\n{}", id="other-algorithm"),
])
def test_unsigned_or_malformed_signatures_are_refused(fleet, stored: bytes):
    with pytest.raises(ManifestSignatureError):
        fleet[1].open(stored)


def test_an_edited_body_breaks_the_signature(fleet):
    signer, verifier = fleet
    stored = signer.sign(b'{"sha256": "aa"}')
    with pytest.raises(ManifestSignatureError):
        verifier.open(stored.replace(b'"aa"', b'"bb"'))


def test_keygen_writes_a_private_key_for_its_owner_only_and_never_overwrites(tmp_path: Path):
    private, public = tmp_path / "k.pem", tmp_path / "k.pub"
    generate_key_pair(private, public)
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    with pytest.raises(FileExistsError):
        generate_key_pair(private, tmp_path / "other.pub")
    with pytest.raises(SigningKeyError, match="not a readable PEM public key"):
        ManifestVerifier.from_file(private)
    with pytest.raises(SigningKeyError, match="private key"):
        ManifestSigner.from_file(public)


# ---- against the S3 API


def _store(bucket: str, client: Any, metrics=None, **signing: Any) -> S3Store:
    return S3Store(bucket, "artifacts", client, metrics=metrics, progress=False, signing=Signing(**signing))


def _blob_gets(client: Any) -> list[str]:
    gets: list[str] = []
    client.meta.events.register("before-parameter-build.s3.GetObject",
                                lambda params, **kw: gets.append(params["Key"]) if "/blobs/" in params["Key"] else None)
    return gets


def test_a_signed_artifact_round_trips(bucket, s3_client, key: CacheKey, artifact: Path, tmp_path: Path, fleet):
    signer, verifier = fleet
    assert _store(bucket, s3_client, signer=signer).publish(key, artifact).published
    stored = s3_client.get_object(Bucket=bucket, Key=f"artifacts/{manifest_name(key.digest())}")["Body"].read()
    assert stored.startswith(b"ts-llm-manifest-signature/1 ed25519 " + signer.key_id.encode())
    gets = _blob_gets(s3_client)
    _store(bucket, s3_client, verifier=verifier).fetch(key, tmp_path / "dest")
    assert read_tree(tmp_path / "dest") == read_tree(artifact)
    assert gets, "the counter of blob downloads sees them"


@pytest.mark.parametrize("forger", ["other-key", "unsigned"])
def test_a_forged_manifest_with_valid_hashes_is_refused_before_any_download(
        bucket, s3_client, key: CacheKey, tmp_path: Path, fleet, metrics, registry, caplog, forger: str):
    # Whoever can write the bucket publishes their own artifact: every SHA-256 in its manifest
    # is right, only the fleet key's signature is missing.
    forged = write_artifact(tmp_path / "forged", seed=7)
    signing = {"signer": _key_pair(tmp_path, "attacker")[0]} if forger == "other-key" else {}
    assert _store(bucket, s3_client, **signing).publish(key, forged).published

    replica = _store(bucket, s3_client, metrics, verifier=fleet[1])
    gets = _blob_gets(s3_client)
    with caplog.at_level(logging.ERROR, logger="handler.cache"), pytest.raises(ManifestSignatureError):
        replica.fetch(key, tmp_path / "dest")
    assert gets == [], "nothing the manifest names was downloaded"
    assert not (tmp_path / "dest").exists()
    assert registry.get_sample_value("ts_llm_cache_artifacts_rejected_total") == 1
    assert registry.get_sample_value("ts_llm_cache_manifest_signatures_rejected_total") == 1
    assert any("REJECTED" in r.getMessage() and "manifest.json" in r.getMessage() for r in caplog.records)
    assert restore(replica, key, tmp_path / "dest") is RestoreOutcome.REJECTED
    assert replica.rejected_version(key) is not None, "remembered for the replacing publish"


def test_without_a_public_key_a_signed_manifest_is_only_hash_checked(bucket, s3_client, key, artifact, tmp_path,
                                                                     fleet):
    _store(bucket, s3_client, signer=fleet[0]).publish(key, artifact)
    _store(bucket, s3_client).fetch(key, tmp_path / "dest")
    assert read_tree(tmp_path / "dest") == read_tree(artifact)
