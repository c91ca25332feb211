"""The warm path's two calls: restore before loading, publish after a cold compile.

Neither lets a cache problem stop the server: a store that is down, empty or serving a bad
artifact means a cold compile, announced in one log line.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future
from enum import StrEnum
from pathlib import Path

from handler.cache.errors import ArtifactNotFound, ArtifactVerificationError, CacheStoreError
from handler.cache.install import install_lock
from handler.cache.key import CacheKey
from handler.cache.store import ArtifactStore

_log = logging.getLogger(__name__)


class RestoreOutcome(StrEnum):
    RESTORED = "restored"
    ALREADY_LOCAL = "already_local"
    MISS = "miss"
    STORE_UNAVAILABLE = "store_unavailable"
    REJECTED = "rejected"


class PublishOutcome(StrEnum):
    PUBLISHED = "published"
    REPLACED = "replaced"  # published over an artifact this replica had rejected
    ALREADY_PRESENT = "already_present"
    STORE_UNAVAILABLE = "store_unavailable"


def restore(store: ArtifactStore, key: CacheKey, dest_dir: Path,
            log: logging.Logger | None = None) -> RestoreOutcome:
    log = log or _log
    digest, where = key.digest(), store.describe()
    try:
        result = store.fetch(key, dest_dir)
    except ArtifactNotFound:
        log.warning("compile cache: miss for %s in %s; starting cold (will compile)", digest, where)
        return RestoreOutcome.MISS
    except ArtifactVerificationError as e:
        # The store already logged the rejection at ERROR; this line says what happens next.
        log.warning("compile cache: artifact %s rejected (%s); starting cold (will compile)", digest, e)
        return RestoreOutcome.REJECTED
    except CacheStoreError as e:
        log.warning("compile cache: store unavailable: %s; starting cold (will compile)", e)
        return RestoreOutcome.STORE_UNAVAILABLE
    if not result.downloaded:
        log.info("compile cache: artifact %s already in %s", digest, dest_dir)
        return RestoreOutcome.ALREADY_LOCAL
    log.info("compile cache: restored %s (%d files, %.1f MB) from %s in %.2f s", digest, result.files,
             result.bytes / 1e6, where, result.seconds)
    return RestoreOutcome.RESTORED


def restore_in_background(store: ArtifactStore, key: CacheKey, dest_dir: Path,
                          log: logging.Logger | None = None) -> Future[RestoreOutcome]:
    """`restore` in a thread; returns once that thread holds dest_dir's install lock.

    A worker looks its artifact up under the same lock (handler.engine.compiled.artifacts.holding), so
    TorchServe can be started now: its JVM and worker start overlap the download, and the
    worker's lookup waits for the restore to end instead of finding nothing and compiling.
    """
    outcome: Future[RestoreOutcome] = Future()
    locked = threading.Event()

    def run() -> None:
        try:
            with install_lock(dest_dir):
                locked.set()
                result = restore(store, key, dest_dir, log)
        except BaseException as err:  # handed to whoever waits on the future
            outcome.set_exception(err)
        else:
            outcome.set_result(result)
        finally:
            locked.set()

    threading.Thread(target=run, name="cache-restore", daemon=True).start()
    locked.wait()
    return outcome


def publish_if_new(store: ArtifactStore, key: CacheKey, src_dir: Path,
                   log: logging.Logger | None = None, replace: str | None = None) -> PublishOutcome:
    """`replace`: the version of the stored manifest this replica rejected (see BlobStore.publish)."""
    log = log or _log
    digest = key.digest()
    try:
        result = store.publish(key, src_dir, replace)
    except CacheStoreError as e:
        log.warning("compile cache: not published, store unavailable: %s", e)
        return PublishOutcome.STORE_UNAVAILABLE
    if not result.published:
        log.info("compile cache: artifact %s already in %s", digest, result.location)
        return PublishOutcome.ALREADY_PRESENT
    log.info("compile cache: published %s (%d files, %.1f MB) to %s", digest, result.files,
             result.bytes / 1e6, result.location)
    return PublishOutcome.REPLACED if result.replaced else PublishOutcome.PUBLISHED
