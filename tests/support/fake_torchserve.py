"""A fake TorchServe 0.12 management API (describe, /token with key renewal, metrics) and its
key file, for the tests of handler.torchserve.client and of the sidecar."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

START = 1_800_000_000.0  # 2027-01-15, a fixed "now" for the pure tests


def describe_entry(model: str, statuses: list[str], pending: int) -> dict[str, object]:
    """One element of TorchServe 0.12's `GET /models/{name}` answer."""
    workers = [{"id": str(9000 + i), "startTime": "2026-01-01T10:00:00.000Z", "status": status,
                "memoryUsage": 0, "pid": 4000 + i, "gpu": False, "gpuUsage": "N/A"}
               for i, status in enumerate(statuses)]
    return {"modelName": model, "modelVersion": "1.0", "modelUrl": f"{model}.mar",
            "runtime": "python", "minWorkers": len(statuses), "maxWorkers": len(statuses),
            "batchSize": 1, "maxBatchDelay": 100, "loadedAtStartup": True, "workers": workers,
            "jobQueueStatus": {"remainingCapacity": 100 - pending, "pendingRequests": pending}}


class FakeManagement:
    """Answers describe and /token like TorchServe 0.12, including 400 InvalidKeyException;
    also plays TorchServe's metrics endpoint (GET /metrics, the handler's running gauge)."""

    def __init__(self, model: str = "llm") -> None:
        self.model = model
        self.statuses = ["READY"]
        self.pending = 0
        self.running: list[int] | None = [0]  # one series per worker; None: not reported yet
        self.management_key: str | None = None  # None: token auth off
        self.api_key = "apikey01"
        self.on_token_refresh = lambda: None  # rewrites key_file.json in the tests that need it
        self.auth_headers: list[str | None] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                         daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    @property
    def metrics_url(self) -> str:
        return self.url + "/metrics"

    def metrics_text(self) -> str:
        """TorchServe 0.12's rendering of a backend gauge, one series per worker host."""
        with self._lock:
            running = list(self.running or [])
        lines = ["# HELP ts_llm_requests_running Torchserve prometheus gauge metric with "
                 "unit: Count", "# TYPE ts_llm_requests_running gauge"] if running else []
        lines += [f'ts_llm_requests_running{{ModelName="{self.model}",Level="Model",'
                  f'Hostname="host{i}",}} {value}.0' for i, value in enumerate(running)]
        return "\n".join(lines) + "\n"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def answer(self, path: str, query: dict[str, list[str]], auth: str | None
               ) -> tuple[int, object]:
        with self._lock:
            self.auth_headers.append(auth)
            if path == "/token":
                if auth != f"Bearer {self.api_key}":
                    return 400, _invalid_key()
                self.on_token_refresh()
                return 200, {}
            if self.management_key is not None and auth != f"Bearer {self.management_key}":
                return 400, _invalid_key()
            if path != f"/models/{self.model}":
                return 404, {"code": 404, "type": "ModelNotFoundException",
                             "message": f"Model not found: {path}"}
            return 200, [describe_entry(self.model, self.statuses, self.pending)]

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            disable_nagle_algorithm = True

            def do_GET(self) -> None:
                parts = urlsplit(self.path)
                if parts.path == "/metrics":
                    self._send(200, "text/plain; version=0.0.4", fake.metrics_text().encode())
                    return
                status, body = fake.answer(parts.path, parse_qs(parts.query),
                                           self.headers.get("Authorization"))
                self._send(status, "application/json", json.dumps(body).encode())

            def _send(self, status: int, content_type: str, payload: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: object) -> None:
                pass

        return Handler


def _invalid_key() -> dict[str, object]:
    return {"code": 400, "type": "InvalidKeyException",
            "message": "Token Authorization failed. Token either incorrect, expired, or not "
                       "provided correctly"}


def write_key_file(path: Path, management_key: str, expires: str,
                   api_key: str = "apikey01") -> None:
    """The shape TorchServe's TokenAuthorization writes (Gson, pretty-printed)."""
    document = {"management": {"key": management_key, "expiration time": expires},
                "inference": {"key": "inferkey", "expiration time": expires},
                "API": {"key": api_key}}
    path.write_text(json.dumps(document, indent=2))
