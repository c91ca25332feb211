"""Resume records in the shared store the sidecar uses (handler.cache: a directory or S3):

    <store root or prefix>/resume/<stream key>.json      handler.resume.record, JSON

A record is written only for a stream that was cut, at the cut, and read by whichever replica
the client reconnects to. Expiry: a record older than `ttl_s` (from its cut) is refused with
"expired" and deleted; `prune`, after each cut, deletes expired records and the oldest beyond
`max_records`. Records are sealed (handler.resume.seal): with the fleet's resume secret, or its
artifact keys; a replica that checks seals but cannot make them writes none (it says so at start).
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from handler.cache import ArtifactStore, CacheStoreError, open_store
from handler.cache.signing import Signing
from handler.resume.ids import key_time
from handler.resume.record import RecordError, ResumeRecord, decode
from handler.resume.seal import RecordSeal, SealError, choose_seal

log = logging.getLogger(__name__)
FOLDER = "resume/"


class ResumeError(Exception):
    """Why a record cannot be read or written; `status` is the HTTP answer to a resume."""

    status = 500


class RecordNotFound(ResumeError):
    status = 404


class RecordExpired(ResumeError):
    status = 410


class RecordRefused(ResumeError):
    """A stored record that failed its seal or validation: never used."""

    status = 404


class StoreFailed(ResumeError):
    """The store could not be read or written (unreachable, credentials): retry later."""

    status = 503


@dataclass(frozen=True)
class ExpiryPolicy:
    ttl_s: float = 600.0
    max_records: int = 1000


def record_name(key: str) -> str:
    return f"{FOLDER}{key}.json"


class ResumeRecords:
    def __init__(self, store: ArtifactStore, seal: RecordSeal, policy: ExpiryPolicy,
                 clock: Callable[[], float] = time.time):
        self.store, self.seal, self.policy, self.clock = store, seal, policy, clock
        self.writable = seal.can_seal

    def describe(self) -> str:
        return f"{self.store.describe()} ({self.seal.describe()})"

    def put(self, record: ResumeRecord) -> None:
        if not self.writable:
            raise StoreFailed(f"{self.describe()}: this replica has no signing key (resume_signing_key), "
                              "so no record is written")
        with _store_errors(f"write {record_name(record.key)}"):
            self.store.write_record(record_name(record.key), self.seal.seal(record.encode()))

    def get(self, key: str, vocab_size: int) -> ResumeRecord:
        """The record of stream `key`; RecordNotFound, RecordExpired, RecordRefused or StoreFailed."""
        with _store_errors(f"read {record_name(key)}"):
            data = self.store.read_record(record_name(key))
        if data is None:
            if key_time(key) + self.policy.ttl_s < self.clock():  # began before the oldest a record may be
                raise RecordExpired(self._expired(key))
            raise RecordNotFound(f"no cut stream {key} in the resume store: it was not cut (only a stream cut by a "
                                 "replica's shutdown can be resumed), or newer records pushed its record out "
                                 f"(at most {self.policy.max_records} are kept); send the request again")
        record = self._open(key, data, vocab_size)
        if record.cut_at + self.policy.ttl_s < self.clock():
            raise RecordExpired(self._expired(key))
        return record

    def prune(self) -> int:
        """Delete expired records, then the oldest beyond max_records; how many were deleted."""
        with _store_errors(f"list {FOLDER}"):
            stored = sorted(self.store.list_records(FOLDER), key=lambda item: item[1])
        oldest_kept = self.clock() - self.policy.ttl_s
        doomed = [name for name, written in stored if written < oldest_kept]
        fresh = [name for name, written in stored if written >= oldest_kept]
        doomed += fresh[:max(0, len(fresh) - self.policy.max_records)]
        with _store_errors(f"delete from {FOLDER}"):
            for name in doomed:
                self.store.delete_record(name)
        return len(doomed)

    def _open(self, key: str, data: bytes, vocab_size: int) -> ResumeRecord:
        try:
            record = decode(self.seal.open(data), vocab_size)
        except (SealError, RecordError) as err:
            log.error("resume: REFUSED record %s from %s: %s", record_name(key), self.describe(), err)
            raise RecordRefused(f"the record of stream {key} was refused ({err}); send the request again") from err
        if record.key != key:
            raise RecordRefused(f"the record stored as stream {key} names stream {record.key}; send the request again")
        return record

    def _expired(self, key: str) -> str:
        return (f"stream {key} was cut more than resume_ttl_s ({self.policy.ttl_s:g} s) ago: its record expired; "
                "send the request again")


def open_records(uri: str, policy: ExpiryPolicy, endpoint_url: str | None = None, region: str | None = None,
                 secret_file: str | None = None, public_key: str | None = None,
                 signing_key: str | None = None) -> ResumeRecords:
    """The records in the store at `uri` (s3://bucket/prefix or a directory: the sidecar's cache_store),
    sealed with the fleet's secret file, else its keys (handler.resume.seal.choose_seal)."""
    seal = choose_seal(secret_file, Signing.from_files(signing_key, public_key))
    return ResumeRecords(open_store(uri, endpoint_url, region), seal, policy)


@contextmanager
def _store_errors(what: str) -> Iterator[None]:
    """Store failures as StoreFailed, saying what was being done."""
    try:
        yield
    except (CacheStoreError, OSError) as err:
        raise StoreFailed(f"resume store: {what} failed ({type(err).__name__}: {err})") from err
