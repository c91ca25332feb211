"""The sidecar's own HTTP endpoints: /ready (readiness.py), /live, /metrics (sidecar_metrics.py,
replica_load.py) and /drain (drain/control.py; POST from loopback only)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from handler.http_server import Handler, HttpServerThread
from handler.sidecar.drain.control import DrainControl
from handler.sidecar.endpoints.readiness import Readiness

log = logging.getLogger(__name__)

# Only these may POST /drain: the port is reachable from the whole cluster network, and a
# drain ends with TorchServe stopped. A preStop hook runs in the pod's network namespace.
LOOPBACK = frozenset({"127.0.0.1", "::1", "::ffff:127.0.0.1"})


class SidecarHttpServer(HttpServerThread):
    def __init__(self, host: str, port: int, readiness: Readiness,
                 is_alive: Callable[[], bool], registry: CollectorRegistry,
                 drain: DrainControl | None = None) -> None:
        super().__init__(host, port, _handler_class(readiness, is_alive, registry, drain),
                         name="sidecar-http")

    def start(self) -> SidecarHttpServer:
        super().start()
        return self


def _handler_class(readiness: Readiness, is_alive: Callable[[], bool],
                   registry: CollectorRegistry,
                   drain: DrainControl | None) -> type[Handler]:
    class EndpointHandler(Handler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/ready":
                ready, body = readiness.check()
                self._json(200 if ready else 503, body)
            elif path == "/live":
                alive = is_alive()
                self._json(200 if alive else 503, {"alive": alive})
            elif path == "/metrics":
                self.send_body(200, CONTENT_TYPE_LATEST, generate_latest(registry))
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
            self.send_body(status, "application/json", json.dumps(body).encode())

        def log_message(self, format: str, *args: object) -> None:
            log.debug("%s %s", self.address_string(), format % args)

    return EndpointHandler
