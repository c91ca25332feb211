"""The planner's figure: fleet size and cost against target rate, cost against spot share, and
the capacity lost to restarts against the interruption rate (warm restore vs cold compile).

Drawn on a bare Figure with the Agg canvas: no pyplot, so no global backend or figure state,
and it works on a machine without a display.
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from handler.planner.model import Plan, per_million, restart_loss_fraction


def rate_grid(target_rps: float, points: int = 25) -> list[float]:
    # From 1% to 200% of the target, evenly spaced on a log axis.
    lo, hi = target_rps / 100, target_rps * 2
    return [lo * (hi / lo) ** (i / (points - 1)) for i in range(points)]


def share_grid(points: int = 21) -> list[float]:
    return [i / (points - 1) for i in range(points)]


def interruption_grid(
    chosen: Plan, drain_s: float, warm_ready_s: float, cold_ready_s: float, points: int = 41
) -> list[float]:
    # Up to 4x the planned rate (at least 0.1/h), stopping before a cold restart would eat half
    # of a replica's hours, where the curve stops meaning anything.
    outage_s = drain_s + chosen.policy.replacement_delay_s + max(warm_ready_s, cold_ready_s)
    top = min(max(4 * chosen.policy.spot_interruptions_per_hour, 0.1), 0.5 * 3600 / outage_s)
    return [top * i / (points - 1) for i in range(points)]


def draw(
    chosen: Plan,
    by_rate: list[Plan],
    by_share: list[Plan],
    path: Path,
    *,
    drain_s: float,
    warm_ready_s: float,
    cold_ready_s: float,
) -> Path:
    fig = Figure(figsize=(17, 4.8), layout="constrained")
    FigureCanvasAgg(fig)
    left, middle, right = fig.subplots(1, 3)
    _replicas_vs_rate(left, chosen, by_rate)
    _cost_vs_share(middle, chosen, by_share)
    _loss_vs_interruptions(right, chosen, drain_s, warm_ready_s, cold_ready_s)
    w = chosen.workload
    fig.suptitle(
        f"Capacity plan: {w.target_rps:,.0f} req/s, {w.prompt_tokens} prompt + "
        f"{w.output_tokens} output tokens, "
        f"{chosen.policy.spot_interruptions_per_hour:g} interruptions/spot-hour"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path


def _replicas_vs_rate(ax: Axes, chosen: Plan, plans: list[Plan]) -> None:
    rates = [p.workload.target_rps for p in plans]
    ax.plot(rates, [p.total_replicas for p in plans], label="total replicas", color="black")
    ax.plot(rates, [p.spot_replicas for p in plans], label="spot", color="tab:green")
    ax.plot(rates, [p.on_demand_replicas for p in plans], label="on-demand", color="tab:blue")
    ax.axvline(chosen.workload.target_rps, color="grey", linestyle=":", label="target")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("target rate (req/s)")
    ax.set_ylabel("replicas")
    ax.grid(True, which="both", alpha=0.3)
    cost = ax.twinx()
    cost.plot(
        rates,
        [p.cost_per_hour for p in plans],
        color="tab:red",
        linestyle="--",
        label="cost per hour",
    )
    cost.set_yscale("log")
    cost.set_ylabel("fleet cost per hour ($)", color="tab:red")
    lines = ax.get_legend_handles_labels()
    more = cost.get_legend_handles_labels()
    ax.legend(lines[0] + more[0], lines[1] + more[1], loc="upper left", fontsize="small")
    ax.set_title("Fleet size and cost vs target rate")


def _cost_vs_share(ax: Axes, chosen: Plan, plans: list[Plan]) -> None:
    rps = chosen.workload.target_rps
    shares = [p.spot_share for p in plans]
    ax.plot(
        shares,
        [p.cost_per_million_requests for p in plans],
        color="tab:green",
        marker="o",
        markersize=3,
        label="warm restore from the S3 cache",
    )
    ax.plot(
        shares,
        [per_million(p.cost_per_hour_if_cold, rps) for p in plans],
        color="tab:orange",
        linestyle="--",
        label="every replacement compiles cold",
    )
    ax.axvline(
        chosen.spot_share, color="black", linestyle=":", label=f"plan: {chosen.spot_share:.0%} spot"
    )
    # Past the plan's share the on-demand floor no longer survives a full spot reclaim.
    ax.axvspan(
        chosen.spot_share, 1.0, color="grey", alpha=0.12, label="below the on-demand floor policy"
    )
    ax.set_xlim(0, 1)
    ax.set_xlabel("spot share of replicas")
    ax.set_ylabel("cost per million requests ($)")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper right", fontsize="small")
    ax.set_title("Cost vs spot share")


def _loss_vs_interruptions(
    ax: Axes,
    chosen: Plan,
    drain_s: float,
    warm_ready_s: float,
    cold_ready_s: float,
) -> None:
    rates = interruption_grid(chosen, drain_s, warm_ready_s, cold_ready_s)
    delay = chosen.policy.replacement_delay_s
    for ready_s, label, style in [
        (warm_ready_s, "warm restore", "-"),
        (cold_ready_s, "cold compile", "--"),
    ]:
        loss = [100 * restart_loss_fraction(r, ready_s, drain_s, delay) for r in rates]
        ax.plot(rates, loss, linestyle=style, label=f"{label} (ready in {ready_s:g} s)")
    ax.axvline(
        chosen.policy.spot_interruptions_per_hour,
        color="black",
        linestyle=":",
        label="planned rate",
    )
    ax.set_xlabel("interruptions per spot instance-hour")
    ax.set_ylabel("spot replica-hours lost to restarts (%)")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", fontsize="small")
    ax.set_title("Capacity lost to restarts")
