"""Reading docs/results/*.json: the fixtures load, and every shortfall names the file, the
missing key and the command that writes the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from handler.planner import results
from handler.planner.results import ResultsError


def load(d: Path):  # type: ignore[no-untyped-def]
    return results.load_benchmarks(d / "serve.json", d / "startup.json", d / "chaos.json")


def test_fixture_results_load(results_dir: Path) -> None:
    b = load(results_dir)
    assert (b.prompt_tokens, b.output_tokens) == (128, 64)
    assert [r.concurrency for r in b.runs if r.system == "ours"] == [1, 4, 16, 64]
    assert (b.warm_ready_s, b.cold_ready_s) == (13.5, 190.0)
    assert (b.drain_s, b.drain_deadline_s, b.requests_lost) == (8.4, 30.0, 0)


def test_default_paths_and_the_message_for_a_file_without_ours(
    results_dir, edit_json, monkeypatch
) -> None:
    edit_json(
        results_dir / "serve.json",
        lambda d: d.update(runs=[r for r in d["runs"] if r["system"] != "ours"]),
    )
    monkeypatch.chdir(results_dir.parent.parent)
    with pytest.raises(ResultsError) as err:
        results.load_benchmarks()
    assert str(err.value) == "docs/results/serve.json has no 'ours' run; run `python -m bench.serve` first"


def test_missing_file(results_dir: Path) -> None:
    (results_dir / "startup.json").unlink()
    with pytest.raises(
        ResultsError, match=r"startup.json does not exist; run `python -m bench.startup` first"
    ):
        load(results_dir)


@pytest.mark.parametrize(
    "name, change, expected",
    [
        ("startup.json", lambda d: d["runs"].pop("warm"), "has no 'runs.warm.ready_s'"),
        ("chaos.json", lambda d: d.pop("drain_seconds"), "has no 'drain_seconds'"),
        ("serve.json", lambda d: d["runs"][2].pop("ttft_p99_s"), "has no 'runs.2.ttft_p99_s'"),
        ("serve.json", lambda d: d.pop("output_tokens"), "has no 'output_tokens'"),
        (
            "serve.json",
            lambda d: d["runs"][0].update(concurrency="16"),
            "has 'runs.0.concurrency' = '16', expected int",
        ),
        (
            "chaos.json",
            lambda d: d.update(requests_lost=True),
            "has 'requests_lost' = True, expected int",
        ),
    ],
)
def test_missing_or_mistyped_key(results_dir, edit_json, name, change, expected) -> None:
    edit_json(results_dir / name, change)
    producer = {
        "serve.json": "python -m bench.serve",
        "startup.json": "python -m bench.startup",
        "chaos.json": "python -m bench.chaos",
    }[name]
    with pytest.raises(ResultsError) as err:
        load(results_dir)
    message = str(err.value)
    assert message.startswith(str(results_dir / name)), message
    assert expected in message
    assert message.endswith(f"; run `{producer}` first")


def test_not_json(results_dir: Path) -> None:
    (results_dir / "chaos.json").write_text("{not json")
    with pytest.raises(ResultsError, match="cannot be read as JSON"):
        load(results_dir)


def test_integers_are_accepted_where_floats_are_expected(results_dir, edit_json) -> None:
    edit_json(results_dir / "startup.json", lambda d: d["runs"]["cold"].update(ready_s=190))
    assert load(results_dir).cold_ready_s == 190.0
