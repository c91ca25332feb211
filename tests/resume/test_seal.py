"""Record seals: the fleet secret's HMAC, the fleet keys' signature, or none; each refuses what it
cannot vouch for, and a replica without a seal refuses a sealed record rather than strip it."""
from __future__ import annotations

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from handler.cache.signing import ManifestSigner, ManifestVerifier, Signing
from handler.resume.seal import FleetKeySeal, NoSeal, SealError, SecretFileError, SecretSeal, choose_seal

RECORD = b'{"key":"k","output_ids":[3]}'


def test_a_secret_seal_opens_what_it_sealed():
    seal = SecretSeal(b"x" * 32)
    assert seal.open(seal.seal(RECORD)) == RECORD


def test_a_secret_seal_refuses_an_edited_record():
    seal = SecretSeal(b"x" * 32)
    edited = seal.seal(RECORD).replace(b"[3]", b"[7]")
    with pytest.raises(SealError, match="edited after it was written"):
        seal.open(edited)


def test_a_secret_seal_refuses_another_fleets_record_naming_both_secrets():
    ours, theirs = SecretSeal(b"x" * 32), SecretSeal(b"y" * 32)
    with pytest.raises(SealError, match=f"sealed with {theirs.key_id}, this replica's is {ours.key_id}"):
        ours.open(theirs.seal(RECORD))


def test_a_secret_seal_refuses_an_unsealed_record():
    with pytest.raises(SealError, match="not sealed"):
        SecretSeal(b"x" * 32).open(RECORD)


def test_a_short_secret_is_refused():
    with pytest.raises(SecretFileError, match="at least 32"):
        SecretSeal(b"short")


def test_the_secret_file_is_read_without_its_trailing_newline(tmp_path):
    path = tmp_path / "secret"
    path.write_bytes(b"z" * 40 + b"\n")
    assert SecretSeal.from_file(str(path)).open(SecretSeal(b"z" * 40).seal(RECORD)) == RECORD


def test_no_seal_refuses_a_sealed_record_it_cannot_check():
    with pytest.raises(SealError, match="resume_secret_file"):
        NoSeal().open(SecretSeal(b"x" * 32).seal(RECORD))


def test_a_fleet_key_seal_refuses_a_record_another_key_signed():
    fleet = Ed25519PrivateKey.generate()
    seal = FleetKeySeal(Signing(ManifestSigner(fleet), ManifestVerifier(fleet.public_key())))
    assert seal.open(seal.seal(RECORD)) == RECORD
    with pytest.raises(SealError, match="does not verify"):
        seal.open(ManifestSigner(Ed25519PrivateKey.generate()).sign(RECORD))


def test_choose_seal_prefers_the_secret_then_the_fleet_keys(tmp_path):
    path = tmp_path / "secret"
    path.write_bytes(b"z" * 32)
    fleet = Ed25519PrivateKey.generate()
    verifying = Signing(verifier=ManifestVerifier(fleet.public_key()))
    assert isinstance(choose_seal(str(path), Signing()), SecretSeal)
    assert isinstance(choose_seal(None, verifying), FleetKeySeal)
    assert not choose_seal(None, verifying).can_seal
    assert isinstance(choose_seal(None, Signing()), NoSeal) and not choose_seal(None, Signing()).checks
