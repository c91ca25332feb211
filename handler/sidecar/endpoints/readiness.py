"""/ready: 200 only while TorchServe has a READY worker for the model and no termination is
pending. TorchServe's /ping is no substitute: a worker still loading or compiling counts as
healthy there.
"""

from __future__ import annotations

from collections.abc import Callable

from handler.sidecar.drain.deps import ModelDescriber
from handler.sidecar.endpoints.sidecar_metrics import SidecarMetrics
from handler.sidecar.notice.board import NoticeBoard
from handler.torchserve.errors import TorchServeError


class Readiness:
    def __init__(self, board: NoticeBoard, torchserve: ModelDescriber,
                 metrics: SidecarMetrics | None = None,
                 worker_error: Callable[[], str | None] | None = None) -> None:
        self._board = board
        self._torchserve = torchserve
        self._metrics = metrics
        self._worker_error = worker_error  # the cause of a failed worker load, from its log

    def check(self) -> tuple[bool, dict[str, object]]:
        ready, body = self._decide()
        if self._metrics is not None:
            self._metrics.ready.set(1 if ready else 0)
        return ready, {"ready": ready, **body}

    def _decide(self) -> tuple[bool, dict[str, object]]:
        notice = self._board.pending()
        if notice is not None:
            return False, {"reason": "termination_pending", "notice": notice.to_json()}
        try:
            state = self._torchserve.describe()
        except TorchServeError as err:
            return False, {"reason": "torchserve_unreachable", "error": str(err)}
        workers = [{"id": worker.id, "status": worker.status} for worker in state.workers]
        if state.ready_workers == 0:
            error = self._worker_error() if self._worker_error is not None else None
            return False, {"reason": "no_ready_worker", "workers": workers, **({"worker_error": error} if error else {})}
        return True, {"reason": "ok", "ready_workers": state.ready_workers, "workers": workers}
