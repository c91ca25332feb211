"""Termination notices and the board that turns them into one drain decision.

The board is the sidecar's whole state machine (in the shape of TGI's SignalHandler): watchers
post notices from their threads, readiness reads `pending()`, and the main loop waits on it.
"""

from __future__ import annotations

import email.utils
import enum
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

Clock = Callable[[], float]  # epoch seconds, time.time in production


class NoticeKind(enum.StrEnum):
    SPOT_INTERRUPTION = "spot_interruption"  # AWS spot/instance-action
    REBALANCE = "rebalance"  # AWS rebalance recommendation: advisory, no deadline promised
    PREEMPTION = "preemption"  # GCP preempted=TRUE or Azure Preempt event
    SIGNAL = "signal"  # SIGTERM/SIGINT, e.g. from the kubelet
    DRAIN_REQUEST = "drain_request"  # POST /drain, e.g. `ts-llm-sidecar drain` as a preStop hook


@dataclass(frozen=True)
class TerminationNotice:
    kind: NoticeKind
    source: str  # "aws" | "gcp" | "azure" | "signal" | "http"
    deadline_epoch: float  # when the machine (or process) is expected to be gone
    detail: dict[str, str] = field(default_factory=dict)

    def seconds_left(self, now: float) -> float:
        return self.deadline_epoch - now

    def to_json(self) -> dict[str, object]:
        return {
            "kind": self.kind.value,
            "source": self.source,
            "deadline_epoch": self.deadline_epoch,
            "detail": dict(self.detail),
        }


def should_drain(notice: TerminationNotice, drain_on_rebalance: bool) -> bool:
    # A rebalance recommendation often never turns into an interruption; draining on it by
    # default is what made NTH nodes stay cordoned forever (NTH #321, #458).
    if notice.kind is NoticeKind.REBALANCE:
        return drain_on_rebalance
    return True


def parse_rfc3339(text: str) -> float:
    """'2026-01-05T18:02:00Z' (AWS spot time, Java Instant) -> epoch seconds."""
    parsed = datetime.fromisoformat(text.strip())
    if parsed.tzinfo is None:
        raise ValueError(f"timestamp without a timezone: {text!r}")
    return parsed.timestamp()


def parse_http_date(text: str) -> float:
    """'Mon, 19 Sep 2016 18:29:47 GMT' (Azure NotBefore) -> epoch seconds."""
    return email.utils.parsedate_to_datetime(text.strip()).timestamp()


class NoticeBoard:
    """Thread-safe record of the notices seen so far.

    The first draining notice starts the drain; later ones can only pull the deadline in
    (a kubelet SIGTERM with a 30 s grace period arriving after a 2-minute spot notice).
    """

    def __init__(self, drain_on_rebalance: bool = False) -> None:
        self._drain_on_rebalance = drain_on_rebalance
        self._listeners: list[Callable[[TerminationNotice], None]] = []
        self._lock = threading.Lock()
        self._draining = threading.Event()
        self._first: TerminationNotice | None = None
        self._deadline: float | None = None
        self._advisories: list[TerminationNotice] = []

    def add_listener(self, listener: Callable[[TerminationNotice], None]) -> None:
        """Called (in the posting thread) for every notice, draining or advisory."""
        self._listeners.append(listener)

    def post(self, notice: TerminationNotice) -> bool:
        """Record a notice; True when it is the one that starts the drain."""
        for listener in self._listeners:
            listener(notice)
        if not should_drain(notice, self._drain_on_rebalance):
            with self._lock:
                self._advisories.append(notice)
            return False
        with self._lock:
            first = self._first is None
            if first:
                self._first = notice
            if self._deadline is None or notice.deadline_epoch < self._deadline:
                self._deadline = notice.deadline_epoch
        self._draining.set()
        return first

    def pending(self) -> TerminationNotice | None:
        with self._lock:
            return self._first

    def deadline(self) -> float | None:
        """Earliest deadline among the draining notices, None before any."""
        with self._lock:
            return self._deadline

    def advisories(self) -> list[TerminationNotice]:
        with self._lock:
            return list(self._advisories)

    def wait(self, timeout_s: float | None) -> TerminationNotice | None:
        self._draining.wait(timeout_s)
        return self.pending()
