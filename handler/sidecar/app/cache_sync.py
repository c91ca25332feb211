"""The sidecar's side of `handler.cache`: restore, publish, and the drain's publisher.

`handler.cache.sync.restore(store, key, dest_dir, log)` and `publish_if_new(store, key, src_dir)`
take an ArtifactStore and a CacheKey. From the command line and the sidecar config those arrive
as text: the store as a URI (`s3://bucket/prefix`, or a local directory; handler.cache.open_store reads it) and the key as the path
of a JSON file holding `CacheKey.describe()`.

The key-file contract: whoever compiles writes `cache-key.json` into the cache directory next
to the artifacts (handler.cache.key.KEY_FILE_NAME); in a pod, an init step writes the same file from the
.mar before the restore (`python -m handler.packing.precompile key MAR --out FILE`). No key file
means nothing to look up (restore: a cold start) and nothing to publish.

What is published is the artifact in the cache directory. With the manifest that a restore or
a worker's install put there (`.artifact-manifest.json`), it must be that manifest's files for
the key in the key file; one whose files or key disagree with its manifest is refused with an
ArtifactDirError, and so is a directory holding a symlink. A directory with nothing but the key
file (the pod's key step wrote it, and the worker loaded the .mar's own artifact) or nothing at
all has nothing to publish.

The restore runs in its own process (an init container), or in a thread of the entrypoint while
TorchServe starts (restore_at_start); its counters and the stored version it rejected leave through
a record beside the cache dir (restore_record.py). A publish replaces exactly that rejected object
(handler.cache.store), so one bad artifact does not send every later replica to a cold start.
"""

from __future__ import annotations

import json
import logging
import threading
from concurrent.futures import Future
from pathlib import Path

from prometheus_client import CollectorRegistry

from handler.cache import (
    ArtifactStore,
    CacheKey,
    CacheMetrics,
    StoreUriError,
    open_store as open_uri,
)
from handler.cache.check import Verdict, check_artifact
from handler.cache.key import KEY_FILE_NAME
from handler.cache.manifest import artifact_files
from handler.cache.signing import Signing
from handler.cache.sync import PublishOutcome, RestoreOutcome, publish_if_new, restore_in_background
from handler.sidecar.app.restore_record import forget_rejection, read_restore_record, write_restore_record
from handler.sidecar.errors import ConfigError, SidecarError

log = logging.getLogger(__name__)
# The one line of the publish after start comes from handler.cache.sync, under this name.
after_start_log = logging.getLogger("handler.sidecar.publish_after_start")

NO_KEY = "no_key"  # no key file: not an error, nothing to do
NO_ARTIFACT = "no_artifact"  # a key but no installed artifact in the cache dir: nothing to publish
ERROR = "error"  # the publish after start failed in a way that is not store_unavailable


class ArtifactDirError(SidecarError):
    """The cache dir holds something that must not be published; the message says what."""


def open_store(uri: str, endpoint_url: str | None = None, region: str | None = None,
               metrics: CacheMetrics | None = None, signing: Signing | None = None) -> ArtifactStore:
    """handler.cache.open_store, with a URI that names no store as a ConfigError (exit 2)."""
    try:
        return open_uri(uri, endpoint_url, region, metrics, signing)
    except StoreUriError as err:
        raise ConfigError(str(err)) from err


def load_key(path: Path) -> CacheKey:
    try:
        fields = json.loads(path.read_text())
        fields.pop("digest", None)  # derived, not a field
        return CacheKey(**fields)
    except (OSError, ValueError, TypeError, AttributeError) as err:
        raise ConfigError(f"{path} is not a cache key file (CacheKey.describe() JSON): {err}"
                          ) from err


# ---- restore (its record for the sidecar's /metrics: restore_record.py)

def restore(store_uri: str, key_path: Path, dest_dir: Path, endpoint_url: str | None = None,
            region: str | None = None, signing: Signing | None = None) -> str:
    return str(start_restore(store_uri, key_path, dest_dir, endpoint_url, region, signing).result())


def start_restore(store_uri: str, key_path: Path, dest_dir: Path, endpoint_url: str | None = None,
                  region: str | None = None, signing: Signing | None = None) -> Future[str]:
    """The restore, running once this returns and holding the cache dir's install lock (see
    handler.cache.sync.restore_in_background): a worker started now waits for it. Its outcome
    and counters go to the restore record when it ends."""
    # The counters leave through the record (a restore step is its own process).
    registry = CollectorRegistry()
    store = open_store(store_uri, endpoint_url, region, CacheMetrics.create(registry), signing)
    restoring: Future[str] | Future[RestoreOutcome]
    key: CacheKey | None = None
    if not key_path.exists():
        log.warning("no cache key at %s: nothing to look up; TorchServe will compile cold",
                    key_path)
        no_key: Future[str] = Future()
        no_key.set_result(NO_KEY)
        restoring = no_key
    else:
        key = load_key(key_path)
        restoring = restore_in_background(store, key, dest_dir, log)
    outcome: Future[str] = Future()  # resolved once the record is written

    def record(done: Future[str] | Future[RestoreOutcome]) -> None:
        if done.exception() is not None:
            outcome.set_exception(done.exception())
            return
        rejected = (key.digest(), store.rejected_version(key)) if key is not None else None
        write_restore_record(dest_dir, str(done.result()), registry, rejected)
        outcome.set_result(str(done.result()))

    restoring.add_done_callback(record)
    return outcome


# ---- publish

def publishable_key(key_path: Path, src_dir: Path) -> CacheKey | str:
    """The key in key_path when src_dir holds an artifact to publish under it, else why not:
    NO_KEY or NO_ARTIFACT. Hashes nothing: the store hashes what it uploads.

    With an installed manifest (a restore's or a worker's install), it must pass
    handler.cache.check's size check for the key file's key. Without one, any file
    besides the key file is an artifact (a directory filled by hand), and a directory holding
    nothing else (the pod's key step's file only) has nothing to publish. Raises
    ArtifactDirError when src_dir holds something that must not be published, and ConfigError
    when the key file is not one."""
    if not key_path.exists():
        return NO_KEY
    key = load_key(key_path)
    present = _artifact_files(src_dir)
    checked = check_artifact(src_dir, key, hashes=False)
    if checked.verdict == Verdict.ABSENT:
        return NO_ARTIFACT if set(present) <= {KEY_FILE_NAME} else key
    if checked.verdict == Verdict.OTHER_KEY:
        built = checked.manifest.key_digest if checked.manifest else "?"
        raise ArtifactDirError(f"the artifact in {src_dir} was built for key {built}, but {key_path} "
                               f"holds key {key.digest()}: not published under the wrong key")
    if not checked.verified:
        raise ArtifactDirError(f"{src_dir} {checked.detail}: not published")
    return key


def _artifact_files(src_dir: Path) -> dict[str, Path]:
    try:
        return dict(artifact_files(src_dir))
    except ValueError as err:  # a symlink
        raise ArtifactDirError(f"{err}: not published") from err
    except OSError as err:
        raise ArtifactDirError(f"cannot list {src_dir}: {err}") from err


def publish(store_uri: str, key_path: Path, src_dir: Path, endpoint_url: str | None = None,
            region: str | None = None, signing: Signing | None = None) -> str:
    """`ts-llm-sidecar publish`. Raises ArtifactDirError for a cache dir with no artifact to
    publish (the command was asked to publish one) or one that must not be published."""
    store = open_store(store_uri, endpoint_url, region, signing=signing)
    key = publishable_key(key_path, src_dir)
    if key == NO_KEY:
        log.warning("%s", nothing_to_publish(key, key_path, src_dir))
        return NO_KEY
    if isinstance(key, str):
        raise ArtifactDirError(nothing_to_publish(key, key_path, src_dir))
    return _publish_if_new(store, key, src_dir, log)


def replaceable(store: ArtifactStore, key: CacheKey, src_dir: Path) -> str | None:
    """The stored manifest version this replica rejected for `key` (in this process, or in the
    restore step's record): its freshly compiled artifact replaces that one, and only that one."""
    record = read_restore_record(src_dir)
    return store.rejected_version(key) or (record.replaces(key) if record is not None else None)


def nothing_to_publish(missing: str, key_path: Path, src_dir: Path) -> str:
    if missing == NO_KEY:
        return f"no cache key at {key_path}: nothing compiled here, nothing to publish"
    return (f"no artifact in {src_dir} (no files besides {KEY_FILE_NAME}; a restore or a "
            "worker's cold compile installs one): nothing to publish")


def _publish_if_new(store: ArtifactStore, key: CacheKey, src_dir: Path,
                    logger: logging.Logger) -> str:
    try:
        outcome = publish_if_new(store, key, src_dir, logger, replaceable(store, key, src_dir))
    except ValueError as err:  # changed under us since the check: empty, or a symlink
        raise ArtifactDirError(f"{err}: not published") from err
    except OSError as err:  # a file vanished or is unreadable (store errors are CacheStoreError)
        raise ArtifactDirError(f"publishing {src_dir} failed: {err}") from err
    if outcome is PublishOutcome.REPLACED:
        forget_rejection(src_dir)
    return str(outcome)


class Publisher:
    """The sidecar's publisher: the drain's CachePublisher (called with publish_by) and the
    one publish after TorchServe is first ready. The store is opened now, so a bad URI fails
    at start-up; the key file is read at publish time, because a
    cold start writes it only once something has been compiled. One publish at a time: a
    drain that starts while the publish after start uploads waits for it, then finds the
    artifact present."""

    def __init__(self, store_uri: str, key_path: Path, src_dir: Path,
                 endpoint_url: str | None = None, region: str | None = None,
                 metrics: CacheMetrics | None = None, signing: Signing | None = None) -> None:
        self.store_uri, self.key_path, self.src_dir = store_uri, key_path, src_dir
        self._store = open_store(store_uri, endpoint_url, region, metrics, signing)
        self._lock = threading.Lock()

    @property
    def store(self) -> ArtifactStore:
        return self._store

    def __call__(self, publish_by: float) -> bool:
        # publish_if_new takes no deadline; the drain abandons it at publish_by instead.
        with self._lock:
            key = publishable_key(self.key_path, self.src_dir)
            if isinstance(key, str):
                log.warning("%s", nothing_to_publish(key, self.key_path, self.src_dir))
                return False
            outcome = _publish_if_new(self._store, key, self.src_dir, log)
        if outcome == "store_unavailable":
            raise SidecarError(f"cache store {self.store_uri} unavailable; not published")
        return outcome in (PublishOutcome.PUBLISHED, PublishOutcome.REPLACED)

    def publish_after_start(self) -> str:
        """Publish once if the cache dir holds an artifact the store lacks (a cold start
        compiled it). Logs one line; returns the outcome: published, already_present,
        store_unavailable, no_key, no_artifact or error. Never raises."""
        try:
            with self._lock:
                key = publishable_key(self.key_path, self.src_dir)
                if isinstance(key, str):
                    after_start_log.info("compile cache after start: %s",
                                         nothing_to_publish(key, self.key_path, self.src_dir))
                    return key
                return _publish_if_new(self._store, key, self.src_dir, after_start_log)
        except Exception as err:  # a background thread: report, never raise
            after_start_log.error("compile cache: not published after start: %s: %s",
                                  type(err).__name__, err)
            return ERROR

