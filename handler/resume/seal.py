"""How resume records are protected in the store: whoever can write the bucket could otherwise put
words in a resumed answer (or token ids the client never saw).

Three seals, one per replica, chosen from its configuration (`choose_seal`):

- `SecretSeal`: HMAC-SHA256 with a fleet secret (a k8s Secret every replica mounts). Pods hold no
  artifact signing key, so this is what the shipped deployment uses. Stored form:

      ts-llm-record-hmac/1 <key id> <base64 HMAC>\\n<record JSON>

- `FleetKeySeal`: the artifact fleet's Ed25519 keys (handler.cache.signing), for fleets whose
  replicas do hold the signing key.
- `NoSeal`: neither configured. It writes plain records and reads plain ones only: a sealed
  record it cannot check is refused, not trusted with its seal line stripped.

A replica with a seal never accepts an unsealed or edited record.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from pathlib import Path
from typing import Protocol

from handler.cache.errors import ManifestSignatureError
from handler.cache.signing import HEADER as FLEET_KEY_HEADER, Signing

HEADER = b"ts-llm-record-hmac/1"
MIN_SECRET_BYTES = 32


class SealError(ValueError):
    """A stored record whose seal is missing, malformed or wrong: refused, never used."""


class SecretFileError(ValueError):
    """The configured secret cannot be read or is too short to protect anything."""


class RecordSeal(Protocol):
    checks: bool  # whether a record read is checked (False: NoSeal)
    can_seal: bool  # False: records written here would be refused everywhere, so none is written

    def seal(self, record: bytes) -> bytes: ...

    def open(self, stored: bytes) -> bytes:
        """The record bytes of a stored record this seal accepts; SealError else."""
        ...

    def describe(self) -> str: ...


class SecretSeal:
    checks = can_seal = True

    def __init__(self, secret: bytes) -> None:
        if len(secret) < MIN_SECRET_BYTES:
            raise SecretFileError(f"the resume secret is {len(secret)} bytes; at least {MIN_SECRET_BYTES} are needed "
                                  "(for example `openssl rand -base64 48`)")
        self._secret = secret
        # Names the secret in refusals without revealing it (an HMAC of a constant, not a hash of it).
        self.key_id = hmac.new(secret, b"ts-llm resume key id", hashlib.sha256).hexdigest()[:16]

    @classmethod
    def from_file(cls, path: str) -> SecretSeal:
        try:
            return cls(Path(path).read_bytes().strip())
        except OSError as err:
            raise SecretFileError(f"resume secret {path}: cannot be read ({err})") from err

    def seal(self, record: bytes) -> bytes:
        mac = base64.b64encode(self._mac(record))
        return b" ".join([HEADER, self.key_id.encode(), mac]) + b"\n" + record

    def open(self, stored: bytes) -> bytes:
        line, _, record = stored.partition(b"\n")
        fields = line.split(b" ")
        if fields[0] != HEADER:
            raise SealError(f"not sealed, and this replica accepts only records sealed with the resume secret {self.key_id}")
        if len(fields) != 3:
            raise SealError("malformed seal line")
        try:
            mac = base64.b64decode(fields[2], validate=True)
        except binascii.Error as err:
            raise SealError("malformed seal line") from err
        if not hmac.compare_digest(mac, self._mac(record)):
            sealer = fields[1].decode("ascii", "replace")
            raise SealError(f"its seal does not match: edited after it was written, or sealed with another secret "
                            f"(sealed with {sealer}, this replica's is {self.key_id})")
        return record

    def describe(self) -> str:
        return f"sealed with the resume secret {self.key_id}"

    def _mac(self, record: bytes) -> bytes:
        return hmac.new(self._secret, record, hashlib.sha256).digest()


class FleetKeySeal:
    checks = True

    def __init__(self, signing: Signing) -> None:
        assert signing.verifier is not None, "without a public key there is nothing to check: NoSeal"
        self._signing = signing
        self.can_seal = signing.signer is not None

    def seal(self, record: bytes) -> bytes:
        assert self._signing.signer is not None, "checked by can_seal"
        return self._signing.signer.sign(record)

    def open(self, stored: bytes) -> bytes:
        assert self._signing.verifier is not None
        try:
            return self._signing.verifier.open(stored)
        except ManifestSignatureError as err:
            raise SealError(str(err)) from err

    def describe(self) -> str:
        assert self._signing.verifier is not None
        return f"signed with the fleet key {self._signing.verifier.key_id}"


class NoSeal:
    checks, can_seal = False, True

    def seal(self, record: bytes) -> bytes:
        return record

    def open(self, stored: bytes) -> bytes:
        if stored.startswith((HEADER + b" ", FLEET_KEY_HEADER + b" ")):
            raise SealError("it is sealed, and this replica has no resume secret or fleet key to check it with: "
                            "configure the fleet's (resume_secret_file)")
        return stored

    def describe(self) -> str:
        return "not sealed (set resume_secret_file: anyone who can write the store could change a resumed answer)"


def choose_seal(secret_file: str | None, signing: Signing) -> RecordSeal:
    """The seal of a replica with these settings (the config check allows one of the two at most)."""
    if secret_file:
        return SecretSeal.from_file(secret_file)
    if signing.verifier is not None:
        return FleetKeySeal(signing)
    return NoSeal()
