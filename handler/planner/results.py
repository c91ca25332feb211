"""Read the benchmark results the planner needs, with errors that say which file lacks what
and which command writes it.

Only the keys the planner uses are required; the files carry more (latency percentiles,
baseline runs, worker-kill recovery) for the docs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from handler.planner.inputs import Benchmarks, PlanError, ServeRun

DEFAULT_SERVE = Path("docs/results/serve.json")
DEFAULT_STARTUP = Path("docs/results/startup.json")
DEFAULT_CHAOS = Path("docs/results/chaos.json")

# The command that writes each file, named in every error about it.
PRODUCERS = {
    "serve": "python -m bench.serve",
    "startup": "python -m bench.startup",
    "chaos": "python -m bench.chaos",
}


class ResultsError(PlanError):
    """A results file is missing, unreadable, or lacks a key the planner needs."""


@dataclass(frozen=True)
class ResultsFile:
    """One JSON file plus what to tell the user when it falls short."""

    path: Path
    producer: str

    def fail(self, problem: str) -> ResultsError:
        return ResultsError(f"{self.path} {problem}; run `{self.producer}` first")

    def load(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            raise self.fail("does not exist") from None
        except (OSError, json.JSONDecodeError) as err:
            raise self.fail(f"cannot be read as JSON ({err})") from None
        if not isinstance(data, dict):
            raise self.fail("is not a JSON object")
        return data

    def get(self, data: dict[str, Any], dotted: str, kind: type) -> Any:
        """data["a"][0]["b"] for dotted "a.0.b", checked to be of `kind` (int counts as
        float, bool counts as nothing else)."""
        node: Any = data
        for part in dotted.split("."):
            if isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            elif isinstance(node, dict) and part in node:
                node = node[part]
            else:
                raise self.fail(f"has no '{dotted}'")
        ok = isinstance(node, kind) or (kind is float and isinstance(node, int))
        if isinstance(node, bool) and kind is not bool:
            ok = False
        if not ok:
            raise self.fail(f"has '{dotted}' = {node!r}, expected {kind.__name__}")
        return float(node) if kind is float else node


def load_serve(f: ResultsFile) -> tuple[int, int, tuple[ServeRun, ...]]:
    data = f.load()
    prompt = f.get(data, "prompt_tokens", int)
    output = f.get(data, "output_tokens", int)
    raw_runs = f.get(data, "runs", list)
    runs = []
    for i in range(len(raw_runs)):
        runs.append(
            ServeRun(
                system=f.get(data, f"runs.{i}.system", str),
                concurrency=f.get(data, f"runs.{i}.concurrency", int),
                errors=f.get(data, f"runs.{i}.errors", int),
                request_throughput=f.get(data, f"runs.{i}.request_throughput", float),
                ttft_p99_s=f.get(data, f"runs.{i}.ttft_p99_s", float),
            )
        )
    if not any(r.system == "ours" for r in runs):
        raise f.fail("has no 'ours' run")
    return prompt, output, tuple(runs)


def load_benchmarks(
    serve: Path = DEFAULT_SERVE, startup: Path = DEFAULT_STARTUP, chaos: Path = DEFAULT_CHAOS
) -> Benchmarks:
    serve_f = ResultsFile(serve, PRODUCERS["serve"])
    startup_f = ResultsFile(startup, PRODUCERS["startup"])
    chaos_f = ResultsFile(chaos, PRODUCERS["chaos"])
    prompt, output, runs = load_serve(serve_f)
    start = startup_f.load()
    drain = chaos_f.load()
    return Benchmarks(
        prompt_tokens=prompt,
        output_tokens=output,
        runs=runs,
        warm_ready_s=startup_f.get(start, "runs.warm.ready_s", float),
        cold_ready_s=startup_f.get(start, "runs.cold.ready_s", float),
        drain_s=chaos_f.get(drain, "drain_seconds", float),
        drain_deadline_s=chaos_f.get(drain, "deadline_seconds", float),
        requests_lost=chaos_f.get(drain, "requests_lost", int),
    )
