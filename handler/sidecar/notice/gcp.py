"""GCP metadata watcher: `instance/preempted`, long-polled with wait_for_change."""

from __future__ import annotations

import random
import time

import requests

from handler.sidecar.errors import MetadataError
from handler.sidecar.notice.retry import DEFAULT_BACKOFF, Backoff, Sleep, call_with_retry, send
from handler.sidecar.notice.termination import Clock, NoticeKind, TerminationNotice

PREEMPTED_PATH = "/computeMetadata/v1/instance/preempted"
FLAVOR = {"Metadata-Flavor": "Google"}


class GcpWatcher:
    """The first poll reads the value and its ETag; every later poll blocks on the server until
    the value differs from that ETag or `wait_timeout_s` passes. Reading first closes the gap
    where a preemption that happened before the first long-poll would never be reported."""

    name = "gcp"

    def __init__(self, base_url: str, *, clock: Clock, session: requests.Session | None = None,
                 wait_timeout_s: int = 60, timeout_s: float = 2.0,
                 notice_s: float = 30.0, backoff: Backoff = DEFAULT_BACKOFF,
                 rng: random.Random | None = None, sleep: Sleep = time.sleep) -> None:
        self._url = base_url.rstrip("/") + PREEMPTED_PATH
        self._clock = clock
        self._session = session or requests.Session()
        self._wait_timeout_s = wait_timeout_s
        self._timeout_s = timeout_s
        # Spot VMs get 30 s between ACPI soft-off and hard-off (Compute API
        # Scheduling.skipGuestOsShutdown); the metadata value carries no time of its own.
        self._notice_s = notice_s
        self._backoff = backoff
        self._rng = rng or random.Random()
        self._sleep = sleep
        self._etag: str | None = None
        self._reported = False

    def poll(self) -> TerminationNotice | None:
        if self._reported:
            return None
        value = call_with_retry(self._read_once, self._backoff, self._rng, self._sleep,
                                f"GCP GET {PREEMPTED_PATH}")
        if value != "TRUE":
            return None
        self._reported = True
        return TerminationNotice(NoticeKind.PREEMPTION, self.name,
                                 self._clock() + self._notice_s, {"preempted": value})

    def _read_once(self) -> str:
        params: dict[str, str] = {}
        timeout_s = self._timeout_s
        if self._etag is not None:
            params = {"wait_for_change": "true", "last_etag": self._etag,
                      "timeout_sec": str(self._wait_timeout_s)}
            # The server holds the request up to timeout_sec by design; that is not a timeout.
            timeout_s = self._wait_timeout_s + self._timeout_s
        response = send(self._session, "GET", self._url, headers=FLAVOR, params=params,
                        timeout_s=timeout_s)
        if response.status_code != 200:
            raise MetadataError(f"GCP GET {PREEMPTED_PATH}: HTTP {response.status_code}")
        self._etag = response.headers.get("ETag", self._etag)
        return response.text.strip().upper()
