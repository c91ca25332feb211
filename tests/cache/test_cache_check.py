"""handler.cache.check: the one answer to "is this directory a complete artifact for this key?"."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from handler.cache.check import Verdict, check_artifact
from handler.cache.manifest import MANIFEST_NAME, build_manifest


@pytest.fixture
def installed(artifact: Path, key) -> Path:
    (artifact / MANIFEST_NAME).write_bytes(build_manifest(artifact, key.describe()).to_json())
    return artifact


@pytest.mark.parametrize("hashes", [True, False])
def test_an_intact_artifact_for_the_key_is_verified(installed: Path, key, hashes: bool):
    checked = check_artifact(installed, key, hashes)
    assert checked.verified and checked.manifest is not None and checked.manifest.key_digest == key.digest()


def test_a_directory_without_a_manifest_holds_no_artifact(artifact: Path, tmp_path: Path, key):
    assert check_artifact(artifact, key, hashes=True).verdict == Verdict.ABSENT
    assert check_artifact(tmp_path / "nothing", key, hashes=True).verdict == Verdict.ABSENT


def test_an_artifact_for_another_key_says_which_fields_differ(installed: Path, make_key):
    checked = check_artifact(installed, make_key(torch_version="9.9"), hashes=False)
    assert checked.verdict == Verdict.OTHER_KEY and "torch_version" in checked.detail


@pytest.mark.parametrize("change, detail", [
    (lambda d: (d / "extra.bin").write_bytes(b"x"), "extra.bin is not in it"),
    (lambda d: (d / "index.json").unlink(), "index.json is missing from it"),
    (lambda d: (d / "index.json").write_bytes(b"{}"), "index.json: size 2 != "),
])
@pytest.mark.parametrize("hashes", [True, False])
def test_files_that_differ_from_the_manifest_are_rejected_and_named(installed: Path, key, change, detail, hashes):
    change(installed)
    checked = check_artifact(installed, key, hashes)
    assert checked.verdict == Verdict.REJECTED and "does not match its manifest" in checked.detail
    if not hashes or "size" not in detail:
        assert detail in checked.detail


def test_only_the_hashing_check_catches_same_size_different_bytes(installed: Path, key):
    target = installed / "fxgraph/ab/graph.bin"
    target.write_bytes(bytes(255 - b for b in target.read_bytes()))
    assert check_artifact(installed, key, hashes=False).verified
    checked = check_artifact(installed, key, hashes=True)
    assert checked.verdict == Verdict.REJECTED and "sha256" in checked.detail


def test_an_unusable_manifest_is_rejected(installed: Path, key):
    (installed / MANIFEST_NAME).write_bytes(b"not json")
    checked = check_artifact(installed, key, hashes=False)
    assert checked.verdict == Verdict.REJECTED and "unusable manifest" in checked.detail


def test_key_fields_that_do_not_match_the_manifests_digest_are_rejected(installed: Path, key):
    doc = json.loads((installed / MANIFEST_NAME).read_bytes())
    doc["key"]["torch_version"] = "0.0"  # the digest field still says ours
    (installed / MANIFEST_NAME).write_text(json.dumps(doc))
    assert check_artifact(installed, key, hashes=False).verdict == Verdict.REJECTED


def test_a_symlink_in_the_artifact_is_rejected(installed: Path, key, tmp_path: Path):
    (installed / "link").symlink_to(tmp_path)
    checked = check_artifact(installed, key, hashes=False)
    assert checked.verdict == Verdict.REJECTED and "symlinks" in checked.detail
