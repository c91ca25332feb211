"""Ed25519 signatures over stored manifests: a writable store is not code execution.

SHA-256 against a manifest from the same store stops corruption, not a writer: whoever can
write the store can write a manifest too, and an artifact is code every replica runs. A
signing publisher stores the manifest behind one line that names its key and signs the bytes
after it:

    ts-llm-manifest-signature/1 ed25519 <key id> <base64 signature>\\n<manifest JSON>

A reader with the fleet's public key checks that line over the raw bytes before it parses the
JSON or downloads anything the manifest names. Keys are PEM files (`./archive.sh keygen`).
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from handler.cache.errors import ManifestSignatureError, SigningKeyError

HEADER = b"ts-llm-manifest-signature/1"
ALGORITHM = b"ed25519"


def key_id(public: Ed25519PublicKey) -> str:
    """A short name for a public key, so that a refusal says which key signed and which one checks."""
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


class ManifestSigner:
    def __init__(self, private: Ed25519PrivateKey) -> None:
        self._private = private
        self.key_id = key_id(private.public_key())

    @classmethod
    def from_file(cls, path: Path) -> ManifestSigner:
        try:
            key = serialization.load_pem_private_key(path.read_bytes(), password=None)
        except (OSError, ValueError, TypeError) as err:
            raise SigningKeyError(f"{path}: not a readable, unencrypted PEM private key ({err})") from err
        if not isinstance(key, Ed25519PrivateKey):
            raise SigningKeyError(f"{path}: not an Ed25519 private key ({type(key).__name__})")
        return cls(key)

    def sign(self, manifest: bytes) -> bytes:
        """The stored form of `manifest`: the signature line, then the bytes it signs."""
        signature = base64.b64encode(self._private.sign(manifest))
        return b" ".join([HEADER, ALGORITHM, self.key_id.encode(), signature]) + b"\n" + manifest


class ManifestVerifier:
    def __init__(self, public: Ed25519PublicKey) -> None:
        self._public = public
        self.key_id = key_id(public)

    @classmethod
    def from_file(cls, path: Path) -> ManifestVerifier:
        try:
            key = serialization.load_pem_public_key(path.read_bytes())
        except (OSError, ValueError, TypeError) as err:
            raise SigningKeyError(f"{path}: not a readable PEM public key ({err})") from err
        if not isinstance(key, Ed25519PublicKey):
            raise SigningKeyError(f"{path}: not an Ed25519 public key ({type(key).__name__})")
        return cls(key)

    def open(self, stored: bytes) -> bytes:
        """The manifest bytes of a stored manifest signed by this key; ManifestSignatureError else."""
        fields, body = _split(stored)
        if fields is None:
            raise ManifestSignatureError(f"unsigned, and this store requires a signature by key {self.key_id}")
        if len(fields) != 3 or fields[0] != ALGORITHM:
            raise ManifestSignatureError("malformed signature line")
        signer = fields[1].decode("ascii", "replace")
        try:
            self._public.verify(base64.b64decode(fields[2], validate=True), body)
        except (InvalidSignature, binascii.Error) as err:
            raise ManifestSignatureError(f"signature does not verify with key {self.key_id} "
                                         f"(signed as key {signer})") from err
        return body


def unverified_body(stored: bytes) -> bytes:
    """The manifest bytes, signature line (if any) dropped unchecked: a store with no public key."""
    return _split(stored)[1]


def _split(stored: bytes) -> tuple[list[bytes] | None, bytes]:
    if not stored.startswith(HEADER + b" "):
        return None, stored
    line, _, body = stored.partition(b"\n")
    return line.split(b" ")[1:], body


@dataclass(frozen=True)
class Signing:
    """What a store does with signatures: sign what it publishes, refuse what the key did not sign."""

    signer: ManifestSigner | None = None
    verifier: ManifestVerifier | None = None

    @classmethod
    def from_files(cls, private_key: str | None, public_key: str | None) -> Signing:
        return cls(ManifestSigner.from_file(Path(private_key)) if private_key else None,
                   ManifestVerifier.from_file(Path(public_key)) if public_key else None)


def generate_key_pair(private_path: Path, public_path: Path) -> str:
    """Write a new Ed25519 key pair (the private key readable by its owner only); its key id.
    Refuses to overwrite either file: replacing a fleet key by mistake locks every replica out."""
    private = Ed25519PrivateKey.generate()
    pem = private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    public = private.public_key().public_bytes(serialization.Encoding.PEM,
                                               serialization.PublicFormat.SubjectPublicKeyInfo)
    if public_path.exists():
        raise FileExistsError(f"{public_path} exists: not overwritten")
    fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    public_path.write_bytes(public)
    return key_id(private.public_key())
