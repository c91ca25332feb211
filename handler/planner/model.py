"""Capacity model: benchmark results and a target load in, a fleet plan out. Pure arithmetic.

Per-replica capacity is the request throughput of the best `ours` benchmark run that meets the
TTFT SLO, scaled by output length (decode dominates an LLM request, so a request twice as long
occupies a batch slot twice as long).

The fleet, for a target rate R and per-replica capacity C at target utilisation u:

    serving   = ceil(R / (C * u))                    replicas that must be up at any moment
    on-demand = min(serving, max(ceil(f_min * serving), ceil(s * R / C)))
    spot      = ceil((serving - on-demand) / (1 - loss))

On-demand floor policy: if every spot replica disappears at once (one correlated reclaim of
the spot pool), the on-demand replicas alone still serve a share s of the target rate at full
measured capacity (no headroom: a correlated reclaim is the emergency the headroom is spent
on, until replacements start), and never fewer than f_min of the serving fleet.

Restart loss: each spot interruption takes a replica out for the drain, the time to get a new
node, and the replacement's time to ready. With interruption rate lam per instance-hour:

    loss = lam * (drain_s + replacement_delay_s + ready_s) / 3600

as a fraction of spot replica-hours; the spot pool is over-provisioned by 1 / (1 - loss).
Comparing ready_s of a warm start (compile artifacts restored from S3) with a cold one (compile
from scratch) shows what the warm cache saves.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from handler.planner.inputs import Benchmarks, FleetPolicy, PlanError, ServeRun, Workload, validate

SECONDS_PER_HOUR = 3600.0
# ceil() of a float that is an integer plus rounding noise (100.00000000001) must not add a
# whole replica.
_CEIL_SLACK = 1e-9


# ---- output ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    workload: Workload
    policy: FleetPolicy
    chosen_concurrency: int
    chosen_ttft_p99_s: float
    capacity_rps_per_replica: float  # at the workload's output length, full utilisation
    serving_replicas: int
    on_demand_replicas: int
    spot_replicas: int
    restart_loss_warm: float  # fraction of spot replica-hours lost to interruptions
    restart_loss_cold: float  # the same if every replacement compiled cold
    spot_replicas_if_cold: int
    cost_per_hour: float
    cost_per_hour_if_cold: float
    all_on_demand_cost_per_hour: float
    notes: tuple[str, ...]

    @property
    def total_replicas(self) -> int:
        return self.on_demand_replicas + self.spot_replicas

    @property
    def spot_share(self) -> float:
        return self.spot_replicas / self.total_replicas if self.total_replicas else 0.0

    @property
    def survivable_rps(self) -> float:
        # What the on-demand floor serves alone, at full measured capacity.
        return self.on_demand_replicas * self.capacity_rps_per_replica

    @property
    def cost_per_million_requests(self) -> float:
        return per_million(self.cost_per_hour, self.workload.target_rps)

    @property
    def all_on_demand_cost_per_million_requests(self) -> float:
        return per_million(self.all_on_demand_cost_per_hour, self.workload.target_rps)

    @property
    def savings_vs_all_on_demand(self) -> float:
        return 1.0 - self.cost_per_hour / self.all_on_demand_cost_per_hour

    @property
    def warm_cache_saving_per_hour(self) -> float:
        return self.cost_per_hour_if_cold - self.cost_per_hour


# ---- the steps ------------------------------------------------------------------------


def ceil(x: float) -> int:
    return math.ceil(x - _CEIL_SLACK)


def per_million(cost_per_hour: float, rps: float) -> float:
    return cost_per_hour / (rps * SECONDS_PER_HOUR) * 1e6


def choose_run(runs: tuple[ServeRun, ...], ttft_slo_s: float | None) -> ServeRun:
    """The `ours` run with the highest request throughput among those without errors that
    meet the SLO; ties go to the lower concurrency (less queueing for the same throughput)."""
    ours = [r for r in runs if r.system == "ours" and r.errors == 0]
    if not ours:
        raise PlanError("no error-free 'ours' run in the serving benchmark")
    ok = [r for r in ours if ttft_slo_s is None or r.ttft_p99_s <= ttft_slo_s]
    if not ok:
        best = min(r.ttft_p99_s for r in ours)
        raise PlanError(
            f"no 'ours' run meets the p99 TTFT SLO of {ttft_slo_s:g} s "
            f"(best measured: {best:g} s); relax --ttft-slo-s or re-benchmark"
        )
    return max(ok, key=lambda r: (r.request_throughput, -r.concurrency))


def replica_capacity_rps(run: ServeRun, bench_output_tokens: int, output_tokens: int) -> float:
    return run.request_throughput * bench_output_tokens / output_tokens


def restart_loss_fraction(
    interruptions_per_hour: float, ready_s: float, drain_s: float, replacement_delay_s: float = 0.0
) -> float:
    loss = interruptions_per_hour * (drain_s + replacement_delay_s + ready_s) / SECONDS_PER_HOUR
    if loss >= 1.0:
        raise PlanError(
            f"a spot replica would spend {loss:.0%} of its time restarting "
            f"({interruptions_per_hour:g} interruptions/hour x "
            f"{drain_s + replacement_delay_s + ready_s:g} s each); spot cannot serve"
        )
    return loss


def serving_replicas(target_rps: float, capacity_rps: float, utilisation: float) -> int:
    return max(1, ceil(target_rps / (capacity_rps * utilisation)))


def on_demand_floor(
    serving: int,
    target_rps: float,
    capacity_rps: float,
    min_fraction: float,
    survive_fraction: float,
) -> int:
    by_fraction = ceil(min_fraction * serving)
    by_survival = ceil(survive_fraction * target_rps / capacity_rps)
    return min(serving, max(by_fraction, by_survival))


def spot_replicas(spot_serving: int, loss: float) -> int:
    return ceil(spot_serving / (1.0 - loss)) if spot_serving else 0


def fleet_cost_per_hour(on_demand: int, spot: int, policy: FleetPolicy) -> float:
    return on_demand * policy.on_demand_price_per_hour + spot * policy.spot_price_per_hour


# ---- the plan -------------------------------------------------------------------------


def plan(
    workload: Workload,
    policy: FleetPolicy,
    bench: Benchmarks,
    on_demand_override: int | None = None,
) -> Plan:
    """The fleet for `workload`. `on_demand_override` replaces the floor policy with a fixed
    on-demand count (used to sweep the spot share)."""
    validate(workload, policy)
    run = choose_run(bench.runs, policy.ttft_slo_s)
    capacity = replica_capacity_rps(run, bench.output_tokens, workload.output_tokens)
    serving = serving_replicas(workload.target_rps, capacity, policy.target_utilisation)
    if on_demand_override is None:
        on_demand = on_demand_floor(
            serving,
            workload.target_rps,
            capacity,
            policy.min_on_demand_fraction,
            policy.survive_fraction,
        )
    else:
        on_demand = min(serving, max(0, on_demand_override))
    rate, delay = policy.spot_interruptions_per_hour, policy.replacement_delay_s
    loss_warm = restart_loss_fraction(rate, bench.warm_ready_s, bench.drain_s, delay)
    loss_cold = restart_loss_fraction(rate, bench.cold_ready_s, bench.drain_s, delay)
    spot = spot_replicas(serving - on_demand, loss_warm)
    spot_cold = spot_replicas(serving - on_demand, loss_cold)
    return Plan(
        workload=workload,
        policy=policy,
        chosen_concurrency=run.concurrency,
        chosen_ttft_p99_s=run.ttft_p99_s,
        capacity_rps_per_replica=capacity,
        serving_replicas=serving,
        on_demand_replicas=on_demand,
        spot_replicas=spot,
        restart_loss_warm=loss_warm,
        restart_loss_cold=loss_cold,
        spot_replicas_if_cold=spot_cold,
        cost_per_hour=fleet_cost_per_hour(on_demand, spot, policy),
        cost_per_hour_if_cold=fleet_cost_per_hour(on_demand, spot_cold, policy),
        all_on_demand_cost_per_hour=fleet_cost_per_hour(serving, 0, policy),
        notes=notes(workload, bench, run),
    )


def notes(workload: Workload, bench: Benchmarks, run: ServeRun) -> tuple[str, ...]:
    """Caveats the numbers carry; printed under the table."""
    out = []
    if bench.requests_lost > 0:
        out.append(
            f"the chaos run lost {bench.requests_lost} requests during a drain: "
            "interruptions cost more than capacity"
        )
    if bench.drain_s >= bench.drain_deadline_s:
        out.append(
            f"the chaos run's drain took {bench.drain_s:g} s, not under its "
            f"{bench.drain_deadline_s:g} s deadline"
        )
    ratio = workload.prompt_tokens / bench.prompt_tokens
    if not 0.5 <= ratio <= 2:
        out.append(
            f"prompts of {workload.prompt_tokens} tokens vs {bench.prompt_tokens} "
            "benchmarked: prefill cost is not scaled, benchmark this shape"
        )
    top = max(r.concurrency for r in bench.runs if r.system == "ours")
    if run.concurrency == top:
        out.append(
            f"the best run is the highest concurrency measured ({top}): a replica may "
            "carry more; benchmark higher concurrency"
        )
    return tuple(out)


# ---- sweeps for the plot --------------------------------------------------------------


def sweep_rates(
    workload: Workload, policy: FleetPolicy, bench: Benchmarks, rates: list[float]
) -> list[Plan]:
    return [plan(replace(workload, target_rps=r), policy, bench) for r in rates]


def sweep_spot_share(
    workload: Workload, policy: FleetPolicy, bench: Benchmarks, shares: list[float]
) -> list[Plan]:
    """Plans with the on-demand count forced to (1 - share) of the serving replicas."""
    base = plan(workload, policy, bench)
    return [
        plan(workload, policy, bench, on_demand_override=ceil((1 - s) * base.serving_replicas))
        for s in shares
    ]
