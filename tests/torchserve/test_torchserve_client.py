"""TorchServeClient against a fake management API speaking TorchServe 0.12's JSON."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from handler.torchserve.client import KeyFile, TorchServeClient, running_reader
from handler.torchserve.errors import TorchServeAuthError, TorchServeError
from tests.support.fake_torchserve import START, FakeManagement, write_key_file

FUTURE = "2030-01-01T00:00:00.123456789Z"  # Java Instant.toString, nanosecond digits
PAST = "2020-01-01T00:00:00Z"


def client(management: FakeManagement, key_file: Path | None = None, clock=lambda: START
           ) -> TorchServeClient:
    return TorchServeClient(management.url, "llm", key_file=key_file, timeout_s=1.0,
                            clock=clock)


def test_describe_parses_workers_and_queue(management: FakeManagement) -> None:
    management.statuses, management.pending = ["READY", "UNLOADING"], 3
    state = client(management).describe()
    assert [w.status for w in state.workers] == ["READY", "UNLOADING"]
    assert state.ready_workers == 1 and state.pending_requests == 3
    assert state.workers[0].id == "9000" and state.workers[0].pid == 4000


def test_unknown_model_is_an_error(management: FakeManagement) -> None:
    management.model = "other"
    with pytest.raises(TorchServeError, match="HTTP 404"):
        client(management).describe()


def test_unreachable_is_a_torchserve_error() -> None:
    with pytest.raises(TorchServeError, match="ConnectionError"):
        TorchServeClient("http://127.0.0.1:9", "llm", timeout_s=0.5).describe()


def test_management_key_sent_as_bearer(management: FakeManagement, tmp_path: Path) -> None:
    write_key_file(tmp_path / "key_file.json", "mgmtkey1", FUTURE)
    management.management_key = "mgmtkey1"
    assert client(management, tmp_path / "key_file.json").describe().ready_workers == 1
    assert management.auth_headers == ["Bearer mgmtkey1"]


def test_expired_key_regenerated_with_the_api_key(management: FakeManagement,
                                                  tmp_path: Path) -> None:
    key_file = tmp_path / "key_file.json"
    write_key_file(key_file, "oldkey01", PAST)
    management.management_key = "newkey01"
    management.on_token_refresh = lambda: write_key_file(key_file, "newkey01", FUTURE)
    assert client(management, key_file).describe().ready_workers == 1
    assert management.auth_headers == ["Bearer apikey01", "Bearer newkey01"]


def test_key_rewritten_by_a_restart_is_picked_up(management: FakeManagement,
                                                  tmp_path: Path) -> None:
    key_file = tmp_path / "key_file.json"
    write_key_file(key_file, "firstkey", FUTURE)
    management.management_key = "firstkey"
    ts = client(management, key_file)
    ts.describe()
    write_key_file(key_file, "secondky", FUTURE)  # TorchServe restarted, new keys
    management.management_key = "secondky"
    assert ts.describe().ready_workers == 1
    assert management.auth_headers == ["Bearer firstkey", "Bearer secondky"]  # no rejection


def test_rejected_key_renewed_once_then_auth_error(management: FakeManagement,
                                                   tmp_path: Path) -> None:
    write_key_file(tmp_path / "key_file.json", "wrongkey", FUTURE)
    management.management_key = "rightkey"
    with pytest.raises(TorchServeAuthError, match="refused after a refresh"):
        client(management, tmp_path / "key_file.json").describe()
    assert management.auth_headers == ["Bearer wrongkey", "Bearer apikey01", "Bearer wrongkey"]


def test_missing_key_file_with_auth_off_works(management: FakeManagement,
                                              tmp_path: Path) -> None:
    """The entrypoint defaults key_file; a TorchServe with auth disabled never writes it."""
    assert client(management, tmp_path / "key_file.json").describe().ready_workers == 1
    assert management.auth_headers == [None]


def test_missing_key_file_with_auth_on_says_so(management: FakeManagement,
                                               tmp_path: Path) -> None:
    management.management_key = "mgmtkey1"
    with pytest.raises(TorchServeAuthError, match="does not exist"):
        client(management, tmp_path / "key_file.json").describe()


def test_key_file_shape(tmp_path: Path) -> None:
    write_key_file(tmp_path / "k.json", "mk", "2030-01-01T00:00:00Z", api_key="ak")
    keys = KeyFile.load(tmp_path / "k.json")
    assert keys is not None
    assert (keys.management_key, keys.api_key, keys.management_expires) == \
        ("mk", "ak", 1893456000.0)


class TextServer:
    """Serves one fixed body, for the in-flight reader."""

    def __init__(self, body: str, content_type: str) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", content_type)
                self.end_headers()
                self.wfile.write(body.encode())

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                         daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("body,content_type,expected", [
    ('# TYPE ts_llm_requests_in_flight gauge\n'
     'ts_llm_requests_in_flight{ModelName="llm",Level="Model",Hostname="a"} 2.0\n'
     'ts_llm_requests_in_flight{ModelName="llm",Level="Model",Hostname="b"} 3.0\n',
     "text/plain; version=0.0.4", 5),
    ('{"in_flight": 4}', "application/json", 4),
    ("7", "application/json", 7),
])
def test_running_reader_sums_prometheus_series_or_reads_json(body: str, content_type: str,
                                                               expected: int) -> None:
    server = TextServer(body, content_type)
    try:
        assert running_reader(server.url, "ts_llm_requests_in_flight")() == expected
    finally:
        server.close()


def test_running_reader_counts_a_metric_not_reported_yet_as_zero(caplog) -> None:
    # TorchServe shows a backend gauge only after a worker first reported it.
    server = TextServer("other_metric 1\n", "text/plain")
    try:
        with caplog.at_level("WARNING"):
            assert running_reader(server.url, "ts_llm_requests_running")() == 0
        assert "ts_llm_requests_running is not on" in caplog.text
    finally:
        server.close()


def test_running_reader_sums_only_the_configured_model() -> None:
    body = ('ts_llm_requests_running{ModelName="llm",Level="Model",Hostname="a",} 2.0\n'
            'ts_llm_requests_running{ModelName="other",Level="Model",Hostname="a",} 5.0\n'
            'ts_llm_requests_running{ModelName="llm",Level="Model",Hostname="b",} 1.0\n')
    server = TextServer(body, "text/plain; version=0.0.4")
    try:
        assert running_reader(server.url, "ts_llm_requests_running", "llm")() == 3
        assert running_reader(server.url, "ts_llm_requests_running")() == 8
    finally:
        server.close()


def test_running_reader_unreachable_is_a_torchserve_error() -> None:
    with pytest.raises(TorchServeError):
        running_reader("http://127.0.0.1:9/metrics", "x", timeout_s=0.5)()
