"""Azure Scheduled Events watcher: `Preempt` events, acknowledged once handled."""

from __future__ import annotations

import json
import random
import time

import requests

from handler.sidecar.errors import MetadataError
from handler.sidecar.notice.retry import DEFAULT_BACKOFF, Backoff, Sleep, call_with_retry, send
from handler.sidecar.notice.termination import Clock, NoticeKind, TerminationNotice, parse_http_date

EVENTS_PATH = "/metadata/scheduledevents"
API_VERSION = {"api-version": "2020-07-01"}
METADATA = {"Metadata": "true"}
# Event types after which this VM is gone; Reboot/Redeploy/Freeze keep the disk and the VM.
TERMINAL_TYPES = frozenset({"Preempt", "Terminate"})


class AzureWatcher:
    name = "azure"

    def __init__(self, base_url: str, *, clock: Clock, session: requests.Session | None = None,
                 timeout_s: float = 2.0, min_notice_s: float = 30.0,
                 backoff: Backoff = DEFAULT_BACKOFF, rng: random.Random | None = None,
                 sleep: Sleep = time.sleep) -> None:
        self._url = base_url.rstrip("/") + EVENTS_PATH
        self._clock = clock
        self._session = session or requests.Session()
        self._timeout_s = timeout_s
        # Preempt has a 30 s minimum notice; a Started event has an empty NotBefore.
        self._min_notice_s = min_notice_s
        self._backoff = backoff
        self._rng = rng or random.Random()
        self._sleep = sleep
        self._seen: set[str] = set()

    def poll(self) -> TerminationNotice | None:
        doc = call_with_retry(self._read_once, self._backoff, self._rng, self._sleep,
                              f"Azure GET {EVENTS_PATH}")
        for event in _events(doc):
            event_id = str(event.get("EventId", ""))
            if event.get("EventType") not in TERMINAL_TYPES or event_id in self._seen:
                continue
            self._seen.add(event_id)
            return self._notice(event, doc.get("DocumentIncarnation"))
        return None

    def acknowledge(self, event_id: str) -> None:
        """Tell the platform it may go ahead now (releases the event for every VM in it)."""
        body = {"StartRequests": [{"EventId": event_id}]}
        response = call_with_retry(
            lambda: send(self._session, "POST", self._url, headers=METADATA, params=API_VERSION,
                         json_body=body, timeout_s=self._timeout_s),
            self._backoff, self._rng, self._sleep, f"Azure POST {EVENTS_PATH}")
        if response.status_code != 200:
            raise MetadataError(f"Azure acknowledge {event_id}: HTTP {response.status_code}")

    def _notice(self, event: dict[str, object], incarnation: object) -> TerminationNotice:
        not_before = str(event.get("NotBefore") or "")
        earliest = self._clock() + self._min_notice_s
        try:
            deadline = parse_http_date(not_before) if not_before else earliest
        except (TypeError, ValueError) as err:
            raise MetadataError(f"Azure NotBefore {not_before!r} is not an HTTP date") from err
        detail = {"event_id": str(event.get("EventId")), "event_type": str(event["EventType"]),
                  "not_before": not_before, "incarnation": str(incarnation)}
        return TerminationNotice(NoticeKind.PREEMPTION, self.name, deadline, detail)

    def _read_once(self) -> dict[str, object]:
        response = send(self._session, "GET", self._url, headers=METADATA, params=API_VERSION,
                        timeout_s=self._timeout_s)
        if response.status_code != 200:
            raise MetadataError(f"Azure GET {EVENTS_PATH}: HTTP {response.status_code}")
        try:
            doc = response.json()
        except json.JSONDecodeError as err:
            raise MetadataError(f"Azure GET {EVENTS_PATH}: body is not JSON") from err
        if not isinstance(doc, dict):
            raise MetadataError(f"Azure GET {EVENTS_PATH}: expected an object, got {doc!r}")
        return doc


def _events(doc: dict[str, object]) -> list[dict[str, object]]:
    events = doc.get("Events", [])
    if not isinstance(events, list):
        raise MetadataError(f"Azure Events is not a list: {events!r}")
    return [event for event in events if isinstance(event, dict)]

