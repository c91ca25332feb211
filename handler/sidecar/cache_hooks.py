"""The seam to `handler.cache`: restore, publish, and the drain's publisher.

`handler.cache.sync.restore(store, key, dest_dir, log)` and `publish_if_new(store, key, src_dir)`
take an ArtifactStore and a CacheKey. From the command line and the sidecar config those arrive
as text: the store as a URI (`s3://bucket/prefix`, or a local directory) and the key as the path
of a JSON file holding `CacheKey.describe()`.

The key-file contract: whoever compiles writes `cache-key.json` into the cache directory next
to the artifacts (config.KEY_FILE_NAME). No key file means nothing was compiled here, so there
is nothing to publish; for a restore, no key means nothing to look up (a cold start).
"""

from __future__ import annotations

import importlib
import json
import logging
import types
from pathlib import Path
from typing import Any

from handler.sidecar.drain import CachePublisher
from handler.sidecar.errors import ConfigError, SidecarError

log = logging.getLogger(__name__)


def cache_package() -> types.ModuleType:
    return _import("handler.cache")


def sync_module() -> types.ModuleType:
    return _import("handler.cache.sync")


def _import(name: str) -> types.ModuleType:
    # Imported lazily: watching and draining must work without the cache code installed.
    try:
        return importlib.import_module(name)
    except ImportError as err:
        raise ConfigError(f"handler.cache.sync is not available ({err})") from err


def open_store(uri: str, endpoint_url: str | None = None, region: str | None = None) -> Any:
    cache = cache_package()
    if uri.startswith("s3://"):
        bucket, _, prefix = uri.removeprefix("s3://").partition("/")
        if not bucket:
            raise ConfigError(f"cache store {uri!r} has no bucket")
        return cache.S3Store(bucket, prefix, cache.make_s3_client(endpoint_url, region),
                             progress=False)
    return cache.LocalStore(Path(uri.removeprefix("file://")), progress=False)


def load_key(path: Path) -> Any:
    try:
        fields = json.loads(path.read_text())
        fields.pop("digest", None)  # derived, not a field
        return cache_package().CacheKey(**fields)
    except (OSError, ValueError, TypeError, AttributeError) as err:
        raise ConfigError(f"{path} is not a cache key file (CacheKey.describe() JSON): {err}"
                          ) from err


NO_KEY = "no_key"  # the outcome when there is no key file: not an error, nothing to do


def restore(store_uri: str, key_path: Path, dest_dir: Path, endpoint_url: str | None = None,
            region: str | None = None) -> str:
    sync = sync_module()
    store = open_store(store_uri, endpoint_url, region)
    if not key_path.exists():
        log.warning("no cache key at %s: nothing to look up; TorchServe will compile cold",
                    key_path)
        return NO_KEY
    return str(sync.restore(store, load_key(key_path), dest_dir, log))


def publish(store_uri: str, key_path: Path, src_dir: Path, endpoint_url: str | None = None,
            region: str | None = None) -> str:
    sync = sync_module()
    store = open_store(store_uri, endpoint_url, region)
    if not key_path.exists():
        log.warning("no cache key at %s: nothing compiled here, nothing to publish", key_path)
        return NO_KEY
    return str(sync.publish_if_new(store, load_key(key_path), src_dir))


def publisher(store_uri: str, key_path: Path, src_dir: Path, endpoint_url: str | None = None,
              region: str | None = None) -> CachePublisher:
    """The drain's publisher. The store is opened now, so a missing cache package or a bad
    URI fails at start-up; the key file is read at publish time, because it is written only
    once something has been compiled."""
    sync = sync_module()
    store = open_store(store_uri, endpoint_url, region)

    def publish_before(publish_by: float) -> bool:
        # publish_if_new takes no deadline; the drain abandons it at publish_by instead.
        if not key_path.exists():
            log.warning("no cache key at %s: nothing compiled here, nothing to publish", key_path)
            return False
        outcome = str(sync.publish_if_new(store, load_key(key_path), src_dir))
        if outcome == "store_unavailable":
            raise SidecarError(f"cache store {store_uri} unavailable; not published")
        return outcome == "published"

    return publish_before
