"""A store from its URI: `s3://bucket/prefix`, or a local directory (`file://` optional).

The URI is how a store arrives from the command line and the configs (the sidecar's
cache_store, archive.sh --aot-store); this is the one place that reads it.
"""

from __future__ import annotations

from pathlib import Path

from handler.cache.errors import StoreUriError
from handler.cache.local import LocalStore
from handler.cache.metrics import CacheMetrics
from handler.cache.s3 import S3Store, make_s3_client
from handler.cache.signing import Signing
from handler.cache.store import ArtifactStore


def open_store(uri: str, endpoint_url: str | None = None, region: str | None = None,
               metrics: CacheMetrics | None = None, signing: Signing | None = None) -> ArtifactStore:
    """`metrics`: the counters to count in (e.g. the sidecar's registry); None: a private set.
    `signing`: sign what is published, refuse manifests the fleet key did not sign.
    Opens nothing remote yet: an S3 store checks its bucket on first use."""
    if uri.startswith("s3://"):
        bucket, _, prefix = uri.removeprefix("s3://").partition("/")
        if not bucket:
            raise StoreUriError(f"cache store {uri!r} has no bucket")
        return S3Store(bucket, prefix, make_s3_client(endpoint_url, region),
                       metrics=metrics, progress=False, signing=signing)
    return LocalStore(Path(uri.removeprefix("file://")), metrics=metrics, progress=False, signing=signing)
