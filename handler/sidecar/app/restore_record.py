"""The restore's record, for the sidecar's /metrics.

The restore runs in its own process (an init container), or in a thread of the entrypoint while
TorchServe starts, so its counters do not go to the watching sidecar's registry directly: it writes
them to a small record beside the cache dir (`.<name>.restore.json`, next to the install lock) and the
sidecar exports them at start. The record also names the version of a stored manifest the restore
rejected: this replica compiles that key cold, and its publish replaces exactly that object."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import CollectorRegistry

from handler.cache import CacheKey
from handler.files import write_atomic

log = logging.getLogger("handler.sidecar.app.cache_sync")  # the restore's own lines


def restore_record_path(cache_dir: Path) -> Path:
    """Beside the cache dir, like the install lock: never inside the artifact."""
    return cache_dir.parent / f".{cache_dir.name}.restore.json"


def write_restore_record(dest_dir: Path, outcome: str, registry: CollectorRegistry,
                          rejected: tuple[str, str | None] | None) -> None:
    def count(name: str) -> int:
        return int(registry.get_sample_value(name) or 0)

    record = {"outcome": outcome, "epoch": time.time(),
              "rejected": count("ts_llm_cache_artifacts_rejected_total"),
              "signature_rejected": count("ts_llm_cache_manifest_signatures_rejected_total"),
              "downloads": count("ts_llm_cache_artifact_downloads_total")}
    if rejected is not None and rejected[1] is not None:
        record["rejected_digest"], record["rejected_version"] = rejected
    path = restore_record_path(dest_dir)
    try:
        write_atomic(path, json.dumps(record))
    except OSError as err:  # the restore itself worked; only its metrics are lost
        log.warning("cannot write the restore record %s (%s): the sidecar will not export "
                    "this restore's outcome", path, err)


@dataclass(frozen=True)
class RestoreRecord:
    outcome: str  # a RestoreOutcome, or NO_KEY
    rejected: int  # artifacts the store rejected during the restore
    downloads: int
    signature_rejected: int = 0  # of the rejected: unsigned or wrongly signed manifests
    rejected_digest: str | None = None  # the key whose stored manifest was rejected...
    rejected_version: str | None = None  # ...and that manifest's version (an S3 ETag): what a publish replaces

    def replaces(self, key: CacheKey) -> str | None:
        """The stored version a publish of `key` may replace: the one this restore rejected."""
        return self.rejected_version if self.rejected_digest == key.digest() else None


def read_restore_record(cache_dir: Path) -> RestoreRecord | None:
    """The last restore's record, or None when there is none (no restore ran) or it is
    unreadable (logged)."""
    path = restore_record_path(cache_dir)
    try:
        record = json.loads(path.read_text())
        return RestoreRecord(str(record["outcome"]), int(record["rejected"]), int(record["downloads"]),
                             int(record.get("signature_rejected", 0)), record.get("rejected_digest"),
                             record.get("rejected_version"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as err:
        log.warning("ignoring the unreadable restore record %s: %s", path, err)
        return None


def forget_rejection(cache_dir: Path) -> None:
    """The rejected version is replaced: a later publish must not replace what replaced it (a
    fresh artifact with the same bytes has the same version)."""
    path = restore_record_path(cache_dir)
    try:
        record = json.loads(path.read_text())
        record.pop("rejected_digest", None)
        record.pop("rejected_version", None)
        write_atomic(path, json.dumps(record))
    except FileNotFoundError:  # no restore record: nothing to forget
        return
    except (OSError, ValueError) as err:
        log.warning("cannot clear the rejection from the restore record %s (%s): a later publish may "
                    "replace the stored artifact again", path, err)
