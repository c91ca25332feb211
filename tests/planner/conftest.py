"""Fixtures for the planner tests: placeholder results (tests/planner/fixtures/*.json) copied
into a temporary directory, and a hand-sized Benchmarks for the model arithmetic."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from handler.planner.inputs import Benchmarks, FleetPolicy, ServeRun, Workload

FIXTURES = Path(__file__).resolve().parent / "fixtures"


@pytest.fixture
def results_dir(tmp_path: Path) -> Path:
    """tmp_path/docs/results/{serve,startup,chaos}.json, so tests can also run from tmp_path
    with the default relative paths."""
    out = tmp_path / "docs" / "results"
    out.mkdir(parents=True)
    for name in ["serve.json", "startup.json", "chaos.json"]:
        shutil.copy(FIXTURES / name, out / name)
    return out


@pytest.fixture
def edit_json():
    def edit(path: Path, change) -> None:  # type: ignore[no-untyped-def]
        data = json.loads(path.read_text())
        change(data)
        path.write_text(json.dumps(data))

    return edit


@pytest.fixture
def bench() -> Benchmarks:
    # Round numbers so the expected plan can be worked out by hand (test_planner_model.py).
    return Benchmarks(
        prompt_tokens=128,
        output_tokens=64,
        runs=(
            ServeRun("ours", 4, errors=1, request_throughput=10.0, ttft_p99_s=0.1),  # has errors
            ServeRun("ours", 16, errors=0, request_throughput=4.0, ttft_p99_s=0.8),
            ServeRun("ours", 64, errors=0, request_throughput=5.0, ttft_p99_s=3.0),
            ServeRun("baseline", 16, errors=0, request_throughput=50.0, ttft_p99_s=0.1),
        ),
        warm_ready_s=30.0,
        cold_ready_s=330.0,
        drain_s=6.0,
        drain_deadline_s=30.0,
        requests_lost=0,
    )


@pytest.fixture
def workload() -> Workload:
    return Workload(target_rps=100.0, prompt_tokens=128, output_tokens=128)


@pytest.fixture
def policy() -> FleetPolicy:
    return FleetPolicy(
        spot_price_per_hour=0.3,
        on_demand_price_per_hour=1.0,
        spot_interruptions_per_hour=0.5,
        min_on_demand_fraction=0.1,
        survive_fraction=0.3,
        target_utilisation=0.5,
        ttft_slo_s=1.0,
    )
