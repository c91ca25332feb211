"""Exceptions raised at the edge of the artifact cache.

    CacheStoreError
     ├── StoreUnavailable           the store cannot be used at all: fix config, network or credentials
     ├── ArtifactNotFound           the store works but holds no artifact for this key (a cache miss)
     ├── ArtifactVerificationError  the artifact does not match its manifest; it is never installed
     │    └── ManifestSignatureError    the manifest is unsigned, or not signed by the fleet's key
     ├── SigningKeyError            a signing or public key file cannot be used
     └── StoreUriError              the store URI names no store (s3:// without a bucket)
"""

from __future__ import annotations


class CacheStoreError(Exception):
    """Base class: every failure the cache reports on purpose."""


class StoreUnavailable(CacheStoreError):
    """Unreachable endpoint, refused credentials, missing bucket. The message says what to fix."""


class ArtifactNotFound(CacheStoreError):
    """No complete artifact (no manifest) is stored under the key."""


class ArtifactVerificationError(CacheStoreError):
    """A file is missing, extra, or differs from the manifest, or the manifest itself is unusable."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


class ManifestSignatureError(ArtifactVerificationError):
    """The stored manifest is unsigned or its signature does not verify with the configured public key."""

    def __init__(self, reason: str) -> None:
        super().__init__("manifest.json", reason)


class SigningKeyError(CacheStoreError):
    """A key file is unreadable or not an Ed25519 key of the kind asked for: a configuration error."""


class StoreUriError(CacheStoreError):
    """The store URI cannot name a store; raised by open_store before anything is contacted."""
