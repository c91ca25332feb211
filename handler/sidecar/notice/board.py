"""The board that turns termination notices into one drain decision.

The board is the sidecar's whole state machine (in the shape of TGI's SignalHandler): watchers
post notices from their threads, readiness reads `pending()`, and the main loop waits on it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from handler.sidecar.notice.termination import TerminationNotice, should_drain


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
