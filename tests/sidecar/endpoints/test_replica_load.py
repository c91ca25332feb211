"""ts_llm_requests_waiting / ts_llm_requests_in_flight on the sidecar's /metrics (the HPA's
signal), read from a fake TorchServe at scrape time."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from handler.sidecar.endpoints.replica_load import IN_FLIGHT, MODEL_LABEL, WAITING, LoadCollector
from handler.torchserve.client import TorchServeClient, running_reader
from tests.support.fake_torchserve import FakeManagement


def scrape(management: FakeManagement, with_running: bool = True) -> dict[str, dict]:
    registry = CollectorRegistry()
    client = TorchServeClient(management.url, "llm", timeout_s=1.0)
    running = running_reader(management.metrics_url, "ts_llm_requests_running", "llm")
    registry.register(LoadCollector("llm", client, running if with_running else None))
    text = generate_latest(registry).decode()
    return {sample.name: sample.labels | {"value": sample.value}
            for family in text_string_to_metric_families(text) for sample in family.samples}


def test_waiting_is_the_queue_and_in_flight_adds_the_running_workers(
        management: FakeManagement) -> None:
    management.pending, management.running = 4, [3, 2]
    samples = scrape(management)
    assert samples[WAITING] == {MODEL_LABEL: "llm", "value": 4.0}
    assert samples[IN_FLIGHT] == {MODEL_LABEL: "llm", "value": 9.0}


def test_without_a_running_source_in_flight_is_the_queue(management: FakeManagement) -> None:
    management.pending = 2
    assert scrape(management, with_running=False)[IN_FLIGHT]["value"] == 2.0


def test_torchserve_down_leaves_the_series_out_instead_of_failing(
        management: FakeManagement) -> None:
    management.close()
    assert scrape(management) == {}
