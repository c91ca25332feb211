"""The /drain endpoint's model: ask for a drain, and see where it stands.

    POST /drain   -> 202 {"state": "draining", ...}  a drain-request notice was posted
                     200 {"state": "draining"|"done", ...}  one was already under way or over
    GET  /drain   -> 200 {"state": "idle"|"draining"|"done", "notice": ..., "report": ...}

A drain request is a termination notice like any other (kind drain_request), with the
deadline now + signal_grace_s: the pod's grace period, which started when the kubelet ran the
preStop hook that sent it. Only loopback clients may POST (endpoints/server.py checks that).
"""

from __future__ import annotations

import threading
from typing import Any

from handler.sidecar.drain.report import DrainReport
from handler.sidecar.notice.board import NoticeBoard
from handler.sidecar.notice.termination import Clock, NoticeKind, TerminationNotice

IDLE, DRAINING, DONE = "idle", "draining", "done"


class DrainControl:
    def __init__(self, board: NoticeBoard, clock: Clock, grace_s: float) -> None:
        self._board = board
        self._clock = clock
        self._grace_s = grace_s
        self._lock = threading.Lock()
        self._report: DrainReport | None = None
        self.done = threading.Event()

    def request(self, requester: str) -> tuple[bool, dict[str, Any]]:
        """Post a drain-request notice; (True, status) when this request started the drain."""
        notice = TerminationNotice(NoticeKind.DRAIN_REQUEST, "http",
                                   self._clock() + self._grace_s, {"requester": requester})
        started = self._board.post(notice)
        return started, self.status()

    def finished(self, report: DrainReport) -> None:
        with self._lock:
            self._report = report
        self.done.set()

    def status(self) -> dict[str, Any]:
        with self._lock:
            report = self._report
        # The board turns "draining" the moment a notice is posted, before the drain loop
        # picks it up, so a GET right after a POST never says "idle".
        notice = self._board.pending()
        state = DONE if report else DRAINING if notice else IDLE
        return {"state": state, "notice": notice.to_json() if notice else None,
                "report": report.to_json() if report else None}
