"""Fixtures for the sidecar tests: the real metadata emulator, a fake TorchServe management
API (real HTTP, real 0.12 JSON shapes), moto in server mode, and a fake clock.

Everything listens on 127.0.0.1 with a free port; nothing leaves the machine.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
import requests

from handler.testing.metadata_emulator import MetadataEmulator

START = 1_800_000_000.0  # 2027-01-15, a fixed "now" for the pure tests


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Every sidecar test is bounded: a hung long-poll or server must fail, not stall CI.
    # A test that sets its own bound (the end-to-end one) keeps it.
    for item in items:
        in_sidecar = "tests/sidecar/" in str(item.fspath).replace("\\", "/")
        if in_sidecar and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(30))


class FakeClock:
    """time.time stand-in; `sleep` advances it instead of waiting."""

    def __init__(self, now: float = START) -> None:
        self.now = now
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def emulator() -> Iterator[MetadataEmulator]:
    with MetadataEmulator() as emu:
        yield emu


@pytest.fixture
def emulator_with_clock(clock: FakeClock) -> Iterator[tuple[MetadataEmulator, FakeClock]]:
    """An emulator whose token expiry runs on the fake clock."""
    with MetadataEmulator(clock=clock) as emu:
        yield emu, clock


# ---- fake TorchServe management API


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

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                pass

        return Handler


def _invalid_key() -> dict[str, object]:
    return {"code": 400, "type": "InvalidKeyException",
            "message": "Token Authorization failed. Token either incorrect, expired, or not "
                       "provided correctly"}


@pytest.fixture
def management() -> Iterator[FakeManagement]:
    fake = FakeManagement()
    yield fake
    fake.close()


def write_key_file(path: Path, management_key: str, expires: str,
                   api_key: str = "apikey01") -> None:
    """The shape TorchServe's TokenAuthorization writes (Gson, pretty-printed)."""
    document = {"management": {"key": management_key, "expiration time": expires},
                "inference": {"key": "inferkey", "expiration time": expires},
                "API": {"key": api_key}}
    path.write_text(json.dumps(document, indent=2))


# ---- moto in server mode


@pytest.fixture(scope="session")
def moto_url() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    with pytest.MonkeyPatch.context() as env:
        # Fake credentials, and no credential or region lookups that could leave the machine.
        env.setenv("AWS_ACCESS_KEY_ID", "testing")
        env.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        env.setenv("AWS_SESSION_TOKEN", "testing")
        env.setenv("AWS_DEFAULT_REGION", "us-east-1")
        env.setenv("AWS_EC2_METADATA_DISABLED", "true")
        env.delenv("AWS_PROFILE", raising=False)
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        yield f"http://{host}:{port}"
        server.stop()


@pytest.fixture
def moto(moto_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """A moto server with empty state, and fake credentials in the environment."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    requests.post(f"{moto_url}/moto-api/reset", timeout=5).raise_for_status()
    return moto_url


# ---- compile cache directories, as a restore or a worker's install leaves them


def cache_key(**change: str):
    cache = pytest.importorskip("handler.cache")
    fields = dict(torch_version="2.13.0", triton_version="none", device_type="cpu",
                  device_capability="x86_64", weights_digest="w" * 16, config_digest="c" * 16,
                  package_version="0.1.0")
    return cache.CacheKey(**{**fields, **change})


def install_artifact(cache_dir: Path, key=None, key_file: bool = True) -> object:
    """An installed artifact: files, the key file inside it (listed, as the worker writes it),
    and the manifest (handler.engine.artifacts.install's layout). Returns the key."""
    from handler.cache.manifest import MANIFEST_NAME, build_manifest

    key = key if key is not None else cache_key()
    (cache_dir / "sub").mkdir(parents=True)
    if key_file:
        (cache_dir / "cache-key.json").write_text(json.dumps(key.describe()))
    (cache_dir / "a.bin").write_bytes(b"kernel" * 100)
    (cache_dir / "sub" / "b.json").write_text('{"graph": 1}')
    (cache_dir / MANIFEST_NAME).write_bytes(build_manifest(cache_dir, key.describe()).to_json())
    return key
