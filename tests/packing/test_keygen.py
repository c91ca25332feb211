"""`./archive.sh keygen`: a fleet key pair that the sidecar and --signing-key read back."""
from __future__ import annotations

from pathlib import Path

from handler.cache.signing import ManifestSigner, ManifestVerifier
from handler.packing.cli import main


def test_keygen_writes_a_pair_that_signs_and_verifies_and_never_overwrites(tmp_path: Path, capsys) -> None:
    private, public = tmp_path / "fleet.pem", tmp_path / "fleet.pub"
    assert main(["keygen", "--private-key", str(private), "--public-key", str(public)]) == 0
    signer, verifier = ManifestSigner.from_file(private), ManifestVerifier.from_file(public)
    assert signer.key_id == verifier.key_id and signer.key_id in capsys.readouterr().out
    assert verifier.open(signer.sign(b"{}")) == b"{}"
    before = private.read_bytes()
    assert main(["keygen", "--private-key", str(private), "--public-key", str(tmp_path / "other.pub")]) == 2
    assert private.read_bytes() == before
