"""`ts-llm-plan` end to end on the placeholder results: table, JSON, plot, errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from handler.planner import cli

REPO = Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def argv(results_dir: Path, *extra: str) -> list[str]:
    return [
        "--rps",
        "1000000",
        "--spot-price",
        "0.0357",
        "--on-demand-price",
        "0.0893",
        "--spot-interruptions-per-hour",
        "0.01",
        "--ttft-slo-s",
        "1.0",
        "--replacement-delay-s",
        "90",
        "--serve-json",
        str(results_dir / "serve.json"),
        "--startup-json",
        str(results_dir / "startup.json"),
        "--chaos-json",
        str(results_dir / "chaos.json"),
        *extra,
    ]


def test_writes_plot_and_json_and_prints_the_table(results_dir, tmp_path, capsys) -> None:
    png, out = tmp_path / "plots" / "capacity.png", tmp_path / "plan.json"
    assert cli.main(argv(results_dir, "--plot", str(png), "--json", str(out))) == 0
    assert png.read_bytes()[:8] == PNG_MAGIC and png.stat().st_size > 10_000
    plan = json.loads(out.read_text())
    assert plan["benchmark"]["concurrency"] == 16
    assert plan["benchmark"]["capacity_rps_per_replica"] == pytest.approx(3.2)
    # ceil(1e6 / (3.2 * 0.7)) and the floor ceil(0.5 * 1e6 / 3.2).
    assert plan["replicas"]["serving"] == 446429
    assert plan["replicas"]["on_demand"] == 156250
    assert plan["replicas"]["total"] == plan["replicas"]["on_demand"] + plan["replicas"]["spot"]
    assert plan["restart_loss"]["warm"] == pytest.approx(0.01 * (8.4 + 90 + 13.5) / 3600)
    assert plan["restart_loss"]["cold"] == pytest.approx(0.01 * (8.4 + 90 + 190) / 3600)
    assert plan["kubernetes"]["ts-llm-ondemand.minReplicas"] == 156250
    table = capsys.readouterr().out
    assert "446,429" in table and "cost per 1M requests" in table


def test_json_to_stdout_replaces_the_table(results_dir, capsys) -> None:
    assert cli.main(argv(results_dir, "--json", "-")) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["inputs"]["workload"] == {
        "target_rps": 1e6,
        "prompt_tokens": 128,
        "output_tokens": 64,
    }
    assert plan["notes"] == []


def test_request_shape_overrides_the_benchmark_shape(results_dir, capsys) -> None:
    assert cli.main(argv(results_dir, "--output-tokens", "128", "--json", "-")) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["benchmark"]["capacity_rps_per_replica"] == pytest.approx(1.6)


def test_missing_results_file_is_a_clear_error(results_dir, capsys) -> None:
    (results_dir / "chaos.json").unlink()
    assert cli.main(argv(results_dir)) == 2
    err = capsys.readouterr().err
    assert "chaos.json does not exist; run `python -m bench.chaos` first" in err


def test_unmet_slo_is_a_clear_error(results_dir, capsys) -> None:
    assert cli.main(argv(results_dir, "--ttft-slo-s", "0.01")) == 2
    assert "no 'ours' run meets the p99 TTFT SLO of 0.01 s" in capsys.readouterr().err


def test_runs_as_a_module(results_dir) -> None:
    """The console script ts-llm-plan points at handler.planner.cli:main; -m runs the same."""
    done = subprocess.run(
        [sys.executable, "-m", "handler.planner.cli", *argv(results_dir, "--json", "-")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["replicas"]["serving"] == 446429
