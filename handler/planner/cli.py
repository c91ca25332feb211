"""`ts-llm-plan`: replicas, spot/on-demand mix, cost and restart loss for a target request rate,
from the benchmark results in docs/results/.

    ts-llm-plan --rps 1000000 --spot-price 0.031 --on-demand-price 0.0864 \\
        --spot-interruptions-per-hour 0.05 [--ttft-slo-s 1.0] [--plot capacity.png] [--json -]

The model and its on-demand floor policy are described in handler/planner/model.py and
docs/capacity.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from handler.planner import model, results
from handler.planner.inputs import Benchmarks, FleetPolicy, PlanError, Workload
from handler.planner.model import Plan


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ts-llm-plan",
        description="Replicas, spot/on-demand mix, cost per million requests and capacity lost "
        "to restarts for a target request rate, from the benchmark results.",
    )
    load = p.add_argument_group("load")
    load.add_argument("--rps", type=float, required=True, help="target requests per second")
    load.add_argument("--prompt-tokens", type=int, help="default: the serving benchmark's")
    load.add_argument("--output-tokens", type=int, help="default: the serving benchmark's")
    load.add_argument(
        "--ttft-slo-s",
        type=float,
        help="p99 time to first token a benchmark run must meet (default: none)",
    )
    fleet = p.add_argument_group("fleet")
    fleet.add_argument("--spot-price", type=float, required=True, help="$ per spot instance-hour")
    fleet.add_argument(
        "--on-demand-price", type=float, required=True, help="$ per on-demand instance-hour"
    )
    fleet.add_argument(
        "--spot-interruptions-per-hour",
        type=float,
        required=True,
        help="interruptions per spot instance-hour (e.g. 0.05 = one per 20 h)",
    )
    fleet.add_argument(
        "--min-on-demand-fraction",
        type=float,
        default=0.1,
        help="on-demand share of the serving replicas, at least (default 0.1)",
    )
    fleet.add_argument(
        "--survive-fraction",
        type=float,
        default=0.5,
        help="share of the target rate on-demand alone serves if all spot "
        "goes at once (default 0.5)",
    )
    fleet.add_argument(
        "--target-utilisation",
        type=float,
        default=0.7,
        help="planned load per replica as a share of measured capacity (default 0.7)",
    )
    fleet.add_argument(
        "--replacement-delay-s",
        type=float,
        default=0.0,
        help="seconds from interruption to a new node running the pod, on top "
        "of the measured drain and ready times (default 0)",
    )
    files = p.add_argument_group("benchmark results")
    for name, default in [
        ("serve", results.DEFAULT_SERVE),
        ("startup", results.DEFAULT_STARTUP),
        ("chaos", results.DEFAULT_CHAOS),
    ]:
        files.add_argument(
            f"--{name}-json",
            type=Path,
            default=default,
            help=f"written by {results.PRODUCERS[name]} (default: {default})",
        )
    out = p.add_argument_group("output")
    out.add_argument("--plot", type=Path, help="write the figure (PNG) here")
    out.add_argument(
        "--json",
        dest="json_out",
        metavar="PATH",
        help="write the plan as JSON here ('-' for stdout, instead of the table)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        bench = results.load_benchmarks(args.serve_json, args.startup_json, args.chaos_json)
        workload, policy = inputs_from_args(args, bench)
        chosen = model.plan(workload, policy, bench)
        if args.plot:
            draw_plot(chosen, workload, policy, bench, args.plot)
    except PlanError as err:
        print(f"ts-llm-plan: error: {err}", file=sys.stderr)
        return 2
    document = to_json(chosen)
    if args.json_out == "-":
        print(json.dumps(document, indent=2))
        return 0
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(document, indent=2) + "\n")
    print(render_table(chosen))
    return 0


def inputs_from_args(args: argparse.Namespace, bench: Benchmarks) -> tuple[Workload, FleetPolicy]:
    workload = Workload(
        target_rps=args.rps,
        prompt_tokens=args.prompt_tokens or bench.prompt_tokens,
        output_tokens=args.output_tokens or bench.output_tokens,
    )
    policy = FleetPolicy(
        spot_price_per_hour=args.spot_price,
        on_demand_price_per_hour=args.on_demand_price,
        spot_interruptions_per_hour=args.spot_interruptions_per_hour,
        min_on_demand_fraction=args.min_on_demand_fraction,
        survive_fraction=args.survive_fraction,
        target_utilisation=args.target_utilisation,
        replacement_delay_s=args.replacement_delay_s,
        ttft_slo_s=args.ttft_slo_s,
    )
    return workload, policy


def draw_plot(
    chosen: Plan, workload: Workload, policy: FleetPolicy, bench: Benchmarks, path: Path
) -> None:
    # Imported here: matplotlib takes a moment to import and only --plot needs it.
    from handler.planner import plot

    by_rate = model.sweep_rates(workload, policy, bench, plot.rate_grid(workload.target_rps))
    by_share = model.sweep_spot_share(workload, policy, bench, plot.share_grid())
    plot.draw(
        chosen,
        by_rate,
        by_share,
        path,
        drain_s=bench.drain_s,
        warm_ready_s=bench.warm_ready_s,
        cold_ready_s=bench.cold_ready_s,
    )


# ---- output ---------------------------------------------------------------------------


def to_json(p: Plan) -> dict[str, Any]:
    return {
        "inputs": {
            "workload": dataclasses.asdict(p.workload),
            "policy": dataclasses.asdict(p.policy),
        },
        "benchmark": {
            "concurrency": p.chosen_concurrency,
            "ttft_p99_s": p.chosen_ttft_p99_s,
            "capacity_rps_per_replica": p.capacity_rps_per_replica,
        },
        "replicas": {
            "serving": p.serving_replicas,
            "on_demand": p.on_demand_replicas,
            "spot": p.spot_replicas,
            "total": p.total_replicas,
            "spot_share": p.spot_share,
            "spot_if_cold": p.spot_replicas_if_cold,
        },
        "survivable_rps_without_spot": p.survivable_rps,
        "restart_loss": {"warm": p.restart_loss_warm, "cold": p.restart_loss_cold},
        "cost": {
            "per_hour": p.cost_per_hour,
            "per_million_requests": p.cost_per_million_requests,
            "all_on_demand_per_hour": p.all_on_demand_cost_per_hour,
            "all_on_demand_per_million_requests": p.all_on_demand_cost_per_million_requests,
            "savings_vs_all_on_demand": p.savings_vs_all_on_demand,
            "if_cold_per_hour": p.cost_per_hour_if_cold,
            "warm_cache_saving_per_hour": p.warm_cache_saving_per_hour,
        },
        "kubernetes": {
            "ts-llm-ondemand.minReplicas": p.on_demand_replicas,
            "ts-llm-spot.maxReplicas_at_least": p.spot_replicas,
        },
        "notes": list(p.notes),
    }


def render_table(p: Plan) -> str:
    w, pol = p.workload, p.policy
    slo = f"{pol.ttft_slo_s:g} s" if pol.ttft_slo_s is not None else "none"
    rows = [
        (
            "target",
            f"{w.target_rps:,.0f} req/s, {w.prompt_tokens} prompt + "
            f"{w.output_tokens} output tokens",
        ),
        (
            "benchmark run",
            f"ours at concurrency {p.chosen_concurrency}, p99 TTFT "
            f"{p.chosen_ttft_p99_s:.3g} s (SLO: {slo})",
        ),
        (
            "per replica",
            f"{p.capacity_rps_per_replica:,.3g} req/s measured, planned at "
            f"{pol.target_utilisation:.0%}",
        ),
        ("", ""),
        ("replicas serving", f"{p.serving_replicas:,}"),
        (
            "  on-demand",
            f"{p.on_demand_replicas:,}  (alone serve {p.survivable_rps:,.0f} req/s = "
            f"{p.survivable_rps / w.target_rps:.0%} of target)",
        ),
        ("  spot", f"{p.spot_replicas:,}  ({p.spot_share:.0%} of the fleet, incl. restart spares)"),
        ("  total", f"{p.total_replicas:,}"),
        (
            "restart loss (spot)",
            f"{p.restart_loss_warm:.3%} warm restore vs "
            f"{p.restart_loss_cold:.3%} cold compile "
            f"({pol.spot_interruptions_per_hour:g}/h)",
        ),
        ("", ""),
        (
            "cost per hour",
            f"${p.cost_per_hour:,.2f}  (all on-demand: "
            f"${p.all_on_demand_cost_per_hour:,.2f}, "
            f"saves {p.savings_vs_all_on_demand:.0%})",
        ),
        (
            "cost per 1M requests",
            f"${p.cost_per_million_requests:,.4f}  (all on-demand: "
            f"${p.all_on_demand_cost_per_million_requests:,.4f})",
        ),
        (
            "warm cache saves",
            f"${p.warm_cache_saving_per_hour:,.2f}/hour, "
            f"{p.spot_replicas_if_cold - p.spot_replicas:,} spot replicas",
        ),
        ("", ""),
        (
            "kubernetes",
            f"ts-llm-ondemand HPA minReplicas: {p.on_demand_replicas:,}; "
            f"ts-llm-spot HPA maxReplicas >= {p.spot_replicas:,}",
        ),
    ]
    width = max(len(label) for label, _ in rows)
    lines = [f"{label:<{width}}  {value}".rstrip() for label, value in rows]
    lines += [f"note: {n}" for n in p.notes]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
