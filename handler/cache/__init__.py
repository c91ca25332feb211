"""Verified store for compile and model artifacts: a local directory or S3."""

from handler.cache.errors import (
    ArtifactNotFound,
    ArtifactVerificationError,
    CacheStoreError,
    StoreUnavailable,
    StoreUriError,
)
from handler.cache.key import CacheKey, current_key, digest_files
from handler.cache.local import LocalStore
from handler.cache.manifest import Manifest, build_manifest, verify_dir
from handler.cache.metrics import CacheMetrics
from handler.cache.s3 import S3Store, make_s3_client
from handler.cache.store import ArtifactStore, FetchResult, PublishResult
from handler.cache.sync import PublishOutcome, RestoreOutcome, publish_if_new, restore
from handler.cache.uri import open_store

__all__ = [
    "ArtifactNotFound", "ArtifactStore", "ArtifactVerificationError", "CacheKey", "CacheMetrics",
    "CacheStoreError", "FetchResult", "LocalStore", "Manifest", "PublishOutcome", "PublishResult",
    "RestoreOutcome", "S3Store", "StoreUnavailable", "StoreUriError", "build_manifest", "current_key",
    "digest_files", "make_s3_client", "open_store", "publish_if_new", "restore", "verify_dir",
]
