"""The planner's inputs: the target load, the fleet's prices and policy, and the benchmark results
it is sized from; checked before any arithmetic (model.py)."""

from __future__ import annotations

from dataclasses import dataclass


class PlanError(ValueError):
    """The inputs or the benchmark results cannot produce a plan; the message says why."""


@dataclass(frozen=True)
class Workload:
    target_rps: float  # requests per second the fleet must serve
    prompt_tokens: int
    output_tokens: int


@dataclass(frozen=True)
class FleetPolicy:
    spot_price_per_hour: float  # per instance-hour
    on_demand_price_per_hour: float
    spot_interruptions_per_hour: float  # per spot instance-hour
    min_on_demand_fraction: float = 0.1  # f_min: floor as a share of the serving replicas
    survive_fraction: float = 0.5  # s: share of the target rate on-demand alone must serve
    target_utilisation: float = 0.7  # u: headroom for bursts and for scaling lag
    replacement_delay_s: float = 0.0  # new node to pod start; not measured by the benchmarks
    ttft_slo_s: float | None = None  # p99 time to first token a run must meet to count


@dataclass(frozen=True)
class ServeRun:
    system: str  # "ours" | "baseline"
    concurrency: int
    errors: int
    request_throughput: float  # req/s
    ttft_p99_s: float


@dataclass(frozen=True)
class Benchmarks:
    """The numbers the planner reads from docs/results/{serve,startup,chaos}.json."""

    prompt_tokens: int
    output_tokens: int
    runs: tuple[ServeRun, ...]
    warm_ready_s: float
    cold_ready_s: float
    drain_s: float
    drain_deadline_s: float
    requests_lost: int


def validate(workload: Workload, policy: FleetPolicy) -> None:
    checks = [
        (workload.target_rps > 0, f"target rate must be > 0, got {workload.target_rps}"),
        (workload.prompt_tokens > 0, f"prompt tokens must be > 0, got {workload.prompt_tokens}"),
        (workload.output_tokens > 0, f"output tokens must be > 0, got {workload.output_tokens}"),
        (
            0 < policy.target_utilisation <= 1,
            f"target utilisation must be in (0, 1], got {policy.target_utilisation}",
        ),
        (
            0 <= policy.min_on_demand_fraction <= 1,
            f"min on-demand fraction must be in [0, 1], got {policy.min_on_demand_fraction}",
        ),
        (
            0 <= policy.survive_fraction <= 1,
            f"survive fraction must be in [0, 1], got {policy.survive_fraction}",
        ),
        (
            policy.spot_interruptions_per_hour >= 0,
            f"interruption rate must be >= 0, got {policy.spot_interruptions_per_hour}",
        ),
        (
            policy.spot_price_per_hour >= 0 and policy.on_demand_price_per_hour > 0,
            "prices must be >= 0 (spot) and > 0 (on-demand)",
        ),
        (
            policy.replacement_delay_s >= 0,
            f"replacement delay must be >= 0, got {policy.replacement_delay_s}",
        ),
    ]
    for ok, message in checks:
        if not ok:
            raise PlanError(message)
