"""SIGTERM/SIGINT as termination notices, so a kubelet's SIGTERM runs the same drain."""

from __future__ import annotations

import queue
import signal
import threading
from collections.abc import Iterable
from types import FrameType

from handler.sidecar.notice.termination import Clock, NoticeKind, TerminationNotice
from handler.sidecar.notice.watcher import OnNotice

DEFAULT_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class SignalWatcher:
    """The handler only puts (signal, time) on a SimpleQueue, whose put is documented as
    reentrant; taking any lock inside a signal handler can deadlock the interrupted thread."""

    name = "signal"

    def __init__(self, *, clock: Clock, grace_s: float,
                 signals: Iterable[signal.Signals] = DEFAULT_SIGNALS) -> None:
        self._clock = clock
        # Kubernetes' terminationGracePeriodSeconds (default 30 s) counts from the SIGTERM.
        self._grace_s = grace_s
        self._signals = tuple(signals)
        self._received: queue.SimpleQueue[tuple[int, float]] = queue.SimpleQueue()
        self._previous: dict[int, object] = {}

    def install(self) -> None:
        """Must run in the main thread (a CPython rule for signal.signal)."""
        for sig in self._signals:
            self._previous[sig] = signal.signal(sig, self.handle)

    def restore(self) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)  # type: ignore[arg-type]
        self._previous.clear()

    def handle(self, signum: int, frame: FrameType | None = None) -> None:
        self._received.put((signum, self._clock()))

    def poll(self, timeout_s: float = 0.0) -> TerminationNotice | None:
        try:
            signum, received = self._received.get(timeout=timeout_s) if timeout_s > 0 \
                else self._received.get_nowait()
        except queue.Empty:
            return None
        name = signal.Signals(signum).name
        return TerminationNotice(NoticeKind.SIGNAL, self.name, received + self._grace_s,
                                 {"signal": name})

    def run(self, on_notice: OnNotice, stop: threading.Event, wake_s: float = 0.2) -> None:
        """Deliver every signal as a notice as soon as it arrives (no polling delay)."""
        while not stop.is_set():
            notice = self.poll(timeout_s=wake_s)
            if notice is not None:
                on_notice(notice)
