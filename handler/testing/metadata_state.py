"""State behind the metadata emulator: IMDSv2 tokens and spot events, GCP `preempted`,
Azure scheduled events, and injected faults. Thread-safe; the clock is injectable so token
expiry can be tested without waiting."""

from __future__ import annotations

import email.utils
import hashlib
import secrets
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass

from handler.sidecar.notice.termination import Clock

MAX_TOKEN_TTL_S = 21600
GCP_MAX_WAIT_S = 300.0


@dataclass(frozen=True)
class Fault:
    status: int | None  # answer with this status instead of the real response (None: real)
    delay_s: float  # hold the request this long first


def iso_utc(epoch: float) -> str:
    """AWS spot time format: '2017-09-18T08:22:00Z' (whole seconds)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


class MetadataState:
    def __init__(self, clock: Clock = time.time, instance_id: str = "i-0123456789abcdef0") -> None:
        self.clock = clock
        self.instance_id = instance_id
        self._cond = threading.Condition()
        self.closing = threading.Event()  # set on shutdown: wakes long-polls and delays
        self.reset()

    def reset(self) -> None:
        with self._cond:
            self._tokens: dict[str, float] = {}
            self.token_puts = 0
            self._spot: dict[str, str] | None = None
            self._rebalance: dict[str, str] | None = None
            self._preempted = False
            self._incarnation = 1
            self._events: list[dict[str, object]] = []
            self.acks: list[str] = []
            self._faults: deque[Fault] = deque()
            self.requests: list[tuple[str, str, int]] = []  # (method, path, status)
            self._cond.notify_all()

    # ---- AWS IMDSv2

    def issue_token(self, ttl_s: int) -> str:
        if not 1 <= ttl_s <= MAX_TOKEN_TTL_S:
            raise ValueError(f"TTL {ttl_s} outside 1..{MAX_TOKEN_TTL_S}")
        token = secrets.token_urlsafe(24)
        with self._cond:
            self._tokens[token] = self.clock() + ttl_s
            self.token_puts += 1
        return token

    def token_seconds_left(self, token: str | None) -> float | None:
        """Remaining TTL, or None for a missing, unknown or expired token (all 401)."""
        with self._cond:
            expires = self._tokens.get(token or "")
        left = None if expires is None else expires - self.clock()
        return left if left is not None and left > 0 else None

    def revoke_tokens(self) -> None:
        with self._cond:
            self._tokens.clear()

    def raise_spot_interruption(self, action: str = "terminate", in_seconds: float = 120.0
                                ) -> dict[str, str]:
        if action not in ("terminate", "stop", "hibernate"):
            raise ValueError(f"spot action must be terminate|stop|hibernate, got {action!r}")
        with self._cond:
            self._spot = {"action": action, "time": iso_utc(self.clock() + in_seconds)}
            return dict(self._spot)

    def raise_rebalance(self) -> dict[str, str]:
        with self._cond:
            self._rebalance = {"noticeTime": iso_utc(self.clock())}
            return dict(self._rebalance)

    def spot_action(self) -> dict[str, str] | None:
        with self._cond:
            return None if self._spot is None else dict(self._spot)

    def rebalance(self) -> dict[str, str] | None:
        with self._cond:
            return None if self._rebalance is None else dict(self._rebalance)

    # ---- GCP

    def preempt_gcp(self) -> None:
        with self._cond:
            self._preempted = True
            self._cond.notify_all()

    def gcp_preempted(self) -> tuple[str, str]:
        with self._cond:
            return self._gcp_value()

    def wait_gcp_change(self, last_etag: str | None, timeout_s: float) -> tuple[str, str]:
        """Return at once if the value's ETag differs from `last_etag`, else when it changes
        or `timeout_s` passes (then with the unchanged value, as GCP does)."""
        timeout_s = min(max(timeout_s, 0.0), GCP_MAX_WAIT_S)
        with self._cond:
            baseline = last_etag if last_etag is not None else self._gcp_value()[1]
            self._cond.wait_for(
                lambda: self._gcp_value()[1] != baseline or self.closing.is_set(), timeout_s)
            return self._gcp_value()

    def _gcp_value(self) -> tuple[str, str]:
        value = "TRUE" if self._preempted else "FALSE"
        return value, hashlib.sha256(value.encode()).hexdigest()[:16]

    # ---- Azure

    def raise_azure_event(self, event_type: str = "Preempt", in_seconds: float = 30.0,
                          resources: list[str] | None = None) -> str:
        event_id = str(uuid.uuid4()).upper()
        event: dict[str, object] = {"EventId": event_id, "EventType": event_type,
                 "ResourceType": "VirtualMachine", "Resources": resources or ["vm-0"],
                 "EventStatus": "Scheduled",
                 "NotBefore": email.utils.formatdate(self.clock() + in_seconds, usegmt=True),
                 "Description": "", "EventSource": "Platform",
                 "DurationInSeconds": -1 if event_type == "Preempt" else 0}
        with self._cond:
            self._events.append(event)
            self._incarnation += 1
        return event_id

    def azure_document(self) -> dict[str, object]:
        with self._cond:
            return {"DocumentIncarnation": self._incarnation,
                    "Events": [dict(event) for event in self._events]}

    def acknowledge(self, event_ids: list[str]) -> None:
        with self._cond:
            self.acks.extend(event_ids)
            for event in self._events:
                if event["EventId"] in event_ids and event["EventStatus"] != "Started":
                    # Approval starts the event at once; a Started event has no NotBefore.
                    event["EventStatus"], event["NotBefore"] = "Started", ""
                    self._incarnation += 1

    # ---- faults and bookkeeping

    def inject_fault(self, count: int, status: int | None = 500, delay_s: float = 0.0) -> None:
        with self._cond:
            self._faults.extend(Fault(status, delay_s) for _ in range(count))

    def take_fault(self) -> Fault | None:
        with self._cond:
            return self._faults.popleft() if self._faults else None

    def record(self, method: str, path: str, status: int) -> None:
        with self._cond:
            self.requests.append((method, path, status))

    def snapshot(self) -> dict[str, object]:
        with self._cond:
            return {"tokens": len(self._tokens), "token_puts": self.token_puts,
                    "spot": self._spot, "rebalance": self._rebalance,
                    "gcp_preempted": self._preempted, "azure": self.azure_document(),
                    "acks": list(self.acks), "faults_left": len(self._faults),
                    "requests": len(self.requests)}

    def close(self) -> None:
        self.closing.set()
        with self._cond:
            self._cond.notify_all()
