"""/ready, /live and /metrics served by the sidecar, against a fake management API."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from prometheus_client import CollectorRegistry

from handler.sidecar.endpoints.readiness import Readiness
from handler.sidecar.endpoints.server import SidecarHttpServer
from handler.sidecar.endpoints.sidecar_metrics import SidecarMetrics
from handler.sidecar.notice.board import NoticeBoard
from handler.sidecar.notice.termination import NoticeKind, TerminationNotice
from handler.torchserve.client import TorchServeClient
from tests.support.fake_torchserve import START, FakeManagement, write_key_file


class Served:
    def __init__(self, management: FakeManagement, key_file: Path | None = None) -> None:
        self.board = NoticeBoard()
        self.registry = CollectorRegistry()
        self.metrics = SidecarMetrics(self.registry)
        self.alive = True
        client = TorchServeClient(management.url, "llm", key_file=key_file, timeout_s=1.0)
        self.server = SidecarHttpServer("127.0.0.1", 0, Readiness(self.board, client,
                                                                  self.metrics),
                                        lambda: self.alive, self.registry).start()
        self.url = f"http://127.0.0.1:{self.server.port}"

    def get(self, path: str) -> requests.Response:
        return requests.get(self.url + path, timeout=2)


@pytest.fixture
def served(management: FakeManagement) -> Iterator[Served]:
    sidecar = Served(management)
    yield sidecar
    sidecar.server.stop()


def spot_notice() -> TerminationNotice:
    return TerminationNotice(NoticeKind.SPOT_INTERRUPTION, "aws", START + 120,
                             {"action": "terminate"})


def test_ready_while_a_worker_is_ready(served: Served) -> None:
    answer = served.get("/ready")
    assert answer.status_code == 200
    assert answer.json()["ready"] is True and answer.json()["ready_workers"] == 1


def test_notice_flips_ready_to_503_with_reason(served: Served) -> None:
    assert served.get("/ready").status_code == 200
    served.board.post(spot_notice())
    answer = served.get("/ready")
    assert answer.status_code == 503
    assert answer.json()["reason"] == "termination_pending"
    assert answer.json()["notice"]["kind"] == "spot_interruption"


def test_rebalance_alone_keeps_ready(served: Served) -> None:
    served.board.post(TerminationNotice(NoticeKind.REBALANCE, "aws", START + 120))
    assert served.get("/ready").status_code == 200


def test_no_ready_worker_is_503(served: Served, management: FakeManagement) -> None:
    management.statuses = ["UNLOADING"]
    answer = served.get("/ready")
    assert answer.status_code == 503 and answer.json()["reason"] == "no_ready_worker"


def test_no_ready_worker_names_the_cause_from_the_worker_log(management: FakeManagement, tmp_path: Path) -> None:
    from handler.sidecar.app.wiring import worker_error

    log = tmp_path / "model_log.log"
    log.write_text("x MODEL_LOG - ValueError: unknown key(s) no_such_key in model-config.yaml `handler:`\n"
                   "x MODEL_LOG - RuntimeError: 500 - Unknown exception\n")
    client = TorchServeClient(management.url, "llm", timeout_s=1.0)
    management.statuses = ["UNLOADING"]
    ready, body = Readiness(NoticeBoard(), client, worker_error=worker_error(str(log))).check()
    assert not ready and body["worker_error"].startswith("ValueError: unknown key(s) no_such_key")


def test_torchserve_down_is_503(served: Served, management: FakeManagement) -> None:
    management.close()
    answer = served.get("/ready")
    assert answer.status_code == 503 and answer.json()["reason"] == "torchserve_unreachable"


def test_ready_uses_the_management_token(management: FakeManagement, tmp_path: Path) -> None:
    write_key_file(tmp_path / "key_file.json", "mgmtkey1", "2030-01-01T00:00:00Z")
    management.management_key = "mgmtkey1"
    sidecar = Served(management, tmp_path / "key_file.json")
    try:
        assert sidecar.get("/ready").status_code == 200
    finally:
        sidecar.server.stop()


def test_live_follows_the_loop(served: Served) -> None:
    assert served.get("/live").status_code == 200
    served.alive = False
    assert served.get("/live").status_code == 503


def test_metrics_come_from_the_registry_passed_in(served: Served) -> None:
    served.metrics.notices.labels(kind="signal").inc()
    served.get("/ready")
    text = served.get("/metrics").text
    assert 'ts_llm_sidecar_notices_total{kind="signal"} 1.0' in text
    assert "ts_llm_sidecar_ready 1.0" in text
    assert "python_gc_objects_collected_total" not in text  # not the global registry


def test_unknown_path_is_404(served: Served) -> None:
    assert served.get("/nope").status_code == 404


def non_loopback_address() -> str | None:
    """An address of this machine other than loopback, if it has one (no packet is sent)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.254", 9))  # TEST-NET-1: routing only, nothing is sent
        except OSError:
            return None
        address = str(probe.getsockname()[0])
    return None if address.startswith("127.") else address


def test_post_drain_is_refused_from_outside_the_pod(management: FakeManagement) -> None:
    from handler.sidecar.drain.control import DrainControl

    address = non_loopback_address()
    if address is None:
        pytest.skip("this machine has no non-loopback IPv4 address")
    board, registry = NoticeBoard(), CollectorRegistry()
    client = TorchServeClient(management.url, "llm", timeout_s=1.0)
    server = SidecarHttpServer("0.0.0.0", 0, Readiness(board, client), lambda: True, registry,
                               DrainControl(board, lambda: START, 30.0)).start()
    try:
        outside = requests.post(f"http://{address}:{server.port}/drain", timeout=2)
        assert outside.status_code == 403 and "loopback only" in outside.json()["error"]
        assert board.pending() is None
        inside = requests.post(f"http://127.0.0.1:{server.port}/drain", timeout=2)
        assert inside.status_code == 202 and board.pending() is not None
    finally:
        server.stop()
