"""One small HTTP server: a ThreadingHTTPServer on its own daemon thread, and the handler base.

The sidecar's /ready /live /metrics /drain (handler/sidecar/endpoints/server.py) and the test
metadata emulator (handler/testing/metadata_emulator.py) both serve with it: start() returns
at once, stop() returns promptly, and every request gets one thread.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Self

# serve_forever checks for shutdown this often; the 0.5 s default makes every stop slow.
SHUTDOWN_POLL_S = 0.05


class Handler(BaseHTTPRequestHandler):
    """Request handler base: `send_body` writes a whole answer."""

    # Headers and body go out in two writes; with Nagle on, keep-alive clients wait for a
    # delayed ACK (~40 ms) on every request.
    disable_nagle_algorithm = True

    def send_body(self, status: int, content_type: str, payload: bytes,
                  headers: Mapping[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(payload)


class HttpServerThread:
    """Serves `handler` on host:port (0: any free port) from a daemon thread named `name`."""

    def __init__(self, host: str, port: int, handler: type[BaseHTTPRequestHandler],
                 name: str) -> None:
        self.host = host
        self._server = ThreadingHTTPServer((host, port), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": SHUTDOWN_POLL_S},
                                        name=name, daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> Self:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
