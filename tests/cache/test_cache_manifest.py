from __future__ import annotations

import json
from pathlib import Path

import pytest

from handler.cache.errors import ArtifactVerificationError
from handler.cache.manifest import Manifest, build_manifest, verify_dir


def test_build_then_verify_round_trips_through_json(artifact: Path, key):
    manifest = build_manifest(artifact, key.describe())
    assert [f.path for f in manifest.files] == sorted(
        p.relative_to(artifact).as_posix() for p in artifact.rglob("*") if p.is_file())
    assert Manifest.from_json(manifest.to_json()) == manifest
    verify_dir(artifact, manifest)


@pytest.mark.parametrize("change, path, reason", [
    (lambda d: (d / "index.json").unlink(), "index.json", "missing"),
    (lambda d: (d / "extra.bin").write_bytes(b"x"), "extra.bin", "not in manifest"),
    (lambda d: (d / "index.json").write_bytes(b"{}"), "index.json", "size"),
    # Same size, different bytes: only the hash can catch it.
    (lambda d: (d / "fxgraph/ab/graph.bin").write_bytes(b"\x00" * 3000), "fxgraph/ab/graph.bin", "sha256"),
])
def test_verify_names_the_differing_file(artifact: Path, key, change, path, reason):
    manifest = build_manifest(artifact, key.describe())
    change(artifact)
    with pytest.raises(ArtifactVerificationError, match=reason) as e:
        verify_dir(artifact, manifest)
    assert e.value.path == path


def _manifest_with(artifact: Path, key, **entry) -> bytes:
    doc = json.loads(build_manifest(artifact, key.describe()).to_json())
    doc["files"][0].update(entry)
    return json.dumps(doc).encode()


@pytest.mark.parametrize("entry", [
    {"path": "../outside.so"},
    {"path": "/etc/outside.so"},
    {"path": "a/./b"},
    {"path": "a\\..\\b"},
    {"path": ".artifact-manifest.json"},
    {"sha256": "../../other-key/blobs/x"},  # would name an object outside the artifact
    {"size": -1},
])
def test_unsafe_manifest_entries_are_refused(artifact: Path, key, entry):
    with pytest.raises(ArtifactVerificationError):
        Manifest.from_json(_manifest_with(artifact, key, **entry))


def test_duplicate_entries_are_refused(artifact: Path, key):
    doc = json.loads(build_manifest(artifact, key.describe()).to_json())
    doc["files"].append(doc["files"][0])
    with pytest.raises(ArtifactVerificationError, match="listed twice"):
        Manifest.from_json(json.dumps(doc).encode())


@pytest.mark.parametrize("data", [b"not json", b"{}", b"[]", b'{"schema": 1, "files": 3}'])
def test_malformed_manifest_is_refused(data: bytes):
    with pytest.raises(ArtifactVerificationError, match="malformed"):
        Manifest.from_json(data)


def test_symlinks_are_not_published(artifact: Path, key, tmp_path: Path):
    (artifact / "link").symlink_to(tmp_path)
    with pytest.raises(ValueError, match="symlinks"):
        build_manifest(artifact, key.describe())
