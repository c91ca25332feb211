"""The sidecar's own HTTP endpoints: /ready, /live, /metrics and /drain (drain_control.py).

/ready is 200 only while TorchServe has a READY worker for the model and no termination is
pending. TorchServe's /ping is no substitute: a worker still loading or compiling counts as
healthy there.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from handler.sidecar.drain import ModelDescriber
from handler.sidecar.drain_control import DrainControl
from handler.torchserve.errors import TorchServeError
from handler.sidecar.metrics import SidecarMetrics
from handler.sidecar.notice import NoticeBoard

log = logging.getLogger(__name__)


# serve_forever checks for shutdown this often; the 0.5 s default makes every stop slow.
SHUTDOWN_POLL_S = 0.05
# Only these may POST /drain: the port is reachable from the whole cluster network, and a
# drain ends with TorchServe stopped. A preStop hook runs in the pod's network namespace.
LOOPBACK = frozenset({"127.0.0.1", "::1", "::ffff:127.0.0.1"})


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


class SidecarHttpServer:
    def __init__(self, host: str, port: int, readiness: Readiness,
                 is_alive: Callable[[], bool], registry: CollectorRegistry,
                 drain: DrainControl | None = None) -> None:
        self._server = ThreadingHTTPServer((host, port), _handler_class(readiness, is_alive,
                                                                        registry, drain))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": SHUTDOWN_POLL_S},
                                        name="sidecar-http", daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> SidecarHttpServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def _handler_class(readiness: Readiness, is_alive: Callable[[], bool],
                   registry: CollectorRegistry,
                   drain: DrainControl | None) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        disable_nagle_algorithm = True  # headers and body are two writes; see emulator.py

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/ready":
                ready, body = readiness.check()
                self._json(200 if ready else 503, body)
            elif path == "/live":
                alive = is_alive()
                self._json(200 if alive else 503, {"alive": alive})
            elif path == "/metrics":
                self._send(200, CONTENT_TYPE_LATEST, generate_latest(registry))
            elif path == "/drain" and drain is not None:
                self._json(200, drain.status())
            else:
                self._json(404, {"error": f"no route {path}"})

        def do_POST(self) -> None:
            path = self.path.split("?", 1)[0]
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if path != "/drain" or drain is None:
                self._json(404, {"error": f"no route POST {path}"})
            elif self.client_address[0] not in LOOPBACK:
                self._json(403, {"error": "POST /drain is accepted from loopback only "
                                          "(run `ts-llm-sidecar drain` inside the pod)"})
            else:
                started, status = drain.request(requester=self.headers.get("User-Agent", ""))
                log.warning("drain requested over HTTP (%s)",
                            "starting" if started else f"already {status['state']}")
                self._json(202 if started else 200, status)

        def _json(self, status: int, body: dict[str, object]) -> None:
            self._send(status, "application/json", json.dumps(body).encode())

        def _send(self, status: int, content_type: str, payload: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            log.debug("%s %s", self.address_string(), format % args)

    return Handler
