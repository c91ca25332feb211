"""The fleet's stop record: measured TorchServe stop times shared through the cache store.

A replica's own record (drain/stop_record.py) lives on its disk and dies with it, so a new
replica's first drain would keep the 10 s default stop reserve. The store keeps one small
object beside the artifacts, independent of any cache key:

    <store root or prefix>/fleet/stop-seconds.json     {"stop_seconds": [2.6, 2.5, ...]}

At start a replica with no local record copies the fleet's to its local record (`seed`); after
a drain, a replica whose local record gained a measurement writes it back (`share`): the last
RECORDED stops measured anywhere in the fleet, whoever wrote last. It is data, never code: its
values are range-checked (stop_record.parse_stop_seconds), and with the fleet's keys it is
signed and verified like a manifest, so a bucket writer cannot set every replica's reserve.
Store calls run in the background under a time bound: a slow store delays neither start nor exit.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from handler.cache import ArtifactStore, CacheStoreError
from handler.cache.errors import ManifestSignatureError
from handler.cache.signing import unverified_body
from handler.sidecar.background_call import BackgroundCall
from handler.sidecar.drain.plan import DrainPolicy
from handler.sidecar.drain.report import DrainReport
from handler.sidecar.drain.stop_record import (
    encode_stop_seconds,
    parse_stop_seconds,
    read_stop_seconds,
    record_stop_seconds,
    stop_reserve,
    write_stop_seconds,
)
from handler.sidecar.notice.termination import Clock

log = logging.getLogger(__name__)
T = TypeVar("T")

NAME = "fleet/stop-seconds.json"
# Errors a store call may end with; none of them may stop a start or a drain.
STORE_ERRORS = (CacheStoreError, OSError, ValueError)
# Bounds on the store calls (one small object): reading it at start, and writing it after a drain
# (until the drain's deadline, at least MIN_SHARE_S).
SEED_TIMEOUT_S = 10.0
MIN_SHARE_S, MAX_SHARE_S = 0.5, 5.0


class MeasuredStops:
    """The stops this replica's drains measured (its local record, drain/stop_record.py), seeded at
    start from the fleet's when it has none and shared back after a drain; the stop reserve they
    give the next drain. record None: no record is kept; store None: no fleet; may_share: this
    replica may write to the store (it publishes to it)."""

    def __init__(self, record: Path | None, store: ArtifactStore | None, may_share: bool, clock: Clock) -> None:
        self.record_path, self.store, self.may_share, self._clock = record, store, may_share, clock
        self._seen: list[float] = []  # the local record at start (or the fleet's seed)

    def load(self) -> bool:
        """At start: read the local record; True when the fleet's should seed it (`seed`, run in the background)."""
        if self.record_path is None:
            return False
        self._seen = read_stop_seconds(self.record_path)
        return self.store is not None and not self._seen

    def seed(self) -> None:
        assert self.store is not None and self.record_path is not None
        seeded = seed(self.store, self.record_path, SEED_TIMEOUT_S)
        if seeded:
            self._seen = seeded

    def policy(self, policy: DrainPolicy) -> DrainPolicy:
        """`policy` with the stop reserve the measured stops give (unchanged without any)."""
        if self.record_path is None or not (measured := read_stop_seconds(self.record_path)):
            return policy
        reserve = stop_reserve(measured, policy.stop_reserve_s)
        log.info("drain: stop reserve %.1f s from %d measured stop(s), the slowest %.2f s (%s)",
                 reserve, len(measured), max(measured), self.record_path)
        return dataclasses.replace(policy, stop_reserve_s=reserve)

    def record(self, report: DrainReport) -> None:
        """A clean stop of TorchServe done by this drain is a measurement for the next one."""
        stop = report.step("stop")
        if self.record_path is None or stop is None or not stop.ok or stop.ended_epoch is None:
            return
        try:
            record_stop_seconds(self.record_path, stop.ended_epoch - stop.started_epoch)
        except OSError as err:
            log.warning("stop record %s not written: %s", self.record_path, err)

    def share(self, share_by: float) -> None:
        """A stop measured here (by this drain, or by the entrypoint in TorchServe's container,
        on the record both share) goes to the fleet, bounded by share_by."""
        if self.store is None or self.record_path is None or not self.may_share:
            return
        timeout_s = max(share_by - self._clock(), MIN_SHARE_S)
        share(self.store, self.record_path, self._seen, min(timeout_s, MAX_SHARE_S))


def read_fleet(store: ArtifactStore) -> list[float]:
    """The fleet's stop times, [] when there are none; ValueError for a record that fails its
    signature or range check."""
    data = store.read_record(NAME)
    if data is None:
        return []
    verifier = store.signing.verifier
    try:
        body = data if verifier is None else verifier.open(data)
    except ManifestSignatureError as err:
        raise ValueError(f"fleet stop record refused: {err}") from err
    return parse_stop_seconds(unverified_body(body) if verifier is None else body)


def write_fleet(store: ArtifactStore, values: list[float]) -> bool:
    data = encode_stop_seconds(values)
    signer = store.signing.signer
    store.write_record(NAME, data if signer is None else signer.sign(data))
    return True


def seed(store: ArtifactStore, local: Path, timeout_s: float) -> list[float]:
    """At start: the local record's stop times; when it has none, the fleet's, copied to it
    (what the next drain here reads). [] when neither has any."""
    values = read_stop_seconds(local)
    if values:
        return values
    fleet = bounded(lambda: read_fleet(store), timeout_s, f"read {NAME} from {store.describe()}")
    if fleet:
        write_stop_seconds(local, fleet)
        log.info("drain: stop reserve from the fleet's measured stops %s (%s in %s)", fleet, NAME,
                 store.describe())
    return fleet or []


def share(store: ArtifactStore, local: Path, seen: list[float], timeout_s: float) -> bool:
    """After a drain: write the local record to the fleet when it differs from what this replica
    saw at start (a drain here measured a stop). True when written."""
    values = read_stop_seconds(local)
    if not values or values == seen:
        return False
    done = bounded(lambda: write_fleet(store, values), timeout_s, f"write {NAME} to {store.describe()}")
    if done is None:
        return False
    log.info("drain: shared the measured stops %s with the fleet (%s in %s)", values, NAME, store.describe())
    return True


def bounded(call: Callable[[], T], timeout_s: float, what: str) -> T | None:
    """call() in a thread of its own, given up after timeout_s; None when the store failed or it timed out
    (logged). Any other error is a bug, raised here."""
    running = BackgroundCall(call, "fleet-stop-record")
    if not running.join(timeout_s):
        log.warning("fleet stop record: %s still running after %.1f s: given up", what, timeout_s)
        return None
    if isinstance(running.error, STORE_ERRORS):
        log.warning("fleet stop record: %s failed (%s: %s)", what, type(running.error).__name__, running.error)
        return None
    if running.error is not None:
        raise running.error
    return running.result
