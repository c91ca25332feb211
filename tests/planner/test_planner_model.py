"""The capacity model's arithmetic, checked against numbers worked out by hand."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from handler.planner import model
from handler.planner.inputs import PlanError, ServeRun


def test_hand_checked_plan(workload, policy, bench) -> None:
    """Worked by hand from the conftest numbers:

    run            c16 (4.0 req/s, p99 TTFT 0.8 <= 1.0 SLO; c4 has errors, c64 misses the SLO)
    capacity       4.0 * 64/128 output tokens = 2.0 req/s
    serving        ceil(100 / (2.0 * 0.5)) = 100
    on-demand      max(ceil(0.1 * 100), ceil(0.3 * 100 / 2.0)) = max(10, 15) = 15
    loss warm      0.5 * (6 + 30) / 3600 = 0.005   -> spot ceil(85 / 0.995) = 86
    loss cold      0.5 * (6 + 330) / 3600 = 0.04667 -> spot ceil(85 / 0.95333) = 90
    cost           15 * 1.0 + 86 * 0.3 = 40.8 $/h; cold 15 + 90 * 0.3 = 42.0; all-OD 100.0
    per 1M         40.8 / (100 * 3600) * 1e6 = 113.33 $
    """
    p = model.plan(workload, policy, bench)
    assert p.chosen_concurrency == 16
    assert p.capacity_rps_per_replica == pytest.approx(2.0)
    assert p.serving_replicas == 100
    assert p.on_demand_replicas == 15
    assert p.restart_loss_warm == pytest.approx(0.005)
    assert p.restart_loss_cold == pytest.approx(0.5 * 336 / 3600)
    assert p.spot_replicas == 86
    assert p.spot_replicas_if_cold == 90
    assert p.total_replicas == 101
    assert p.cost_per_hour == pytest.approx(40.8)
    assert p.cost_per_hour_if_cold == pytest.approx(42.0)
    assert p.all_on_demand_cost_per_hour == pytest.approx(100.0)
    assert p.cost_per_million_requests == pytest.approx(113.333, abs=1e-3)
    assert p.savings_vs_all_on_demand == pytest.approx(0.592)
    assert p.warm_cache_saving_per_hour == pytest.approx(1.2)
    assert p.survivable_rps == pytest.approx(30.0)


def test_on_demand_alone_survives_the_promised_share(workload, policy, bench) -> None:
    for survive in [0.0, 0.25, 0.5, 0.9, 1.0]:
        p = model.plan(workload, dataclasses.replace(policy, survive_fraction=survive), bench)
        assert p.survivable_rps >= survive * workload.target_rps - 1e-9, survive


def test_min_on_demand_fraction_is_a_floor(workload, policy, bench) -> None:
    p = model.plan(
        workload,
        dataclasses.replace(policy, survive_fraction=0.0, min_on_demand_fraction=0.25),
        bench,
    )
    assert p.on_demand_replicas == 25


def test_all_on_demand_when_the_floor_covers_everything(workload, policy, bench) -> None:
    p = model.plan(workload, dataclasses.replace(policy, survive_fraction=1.0), bench)
    # Surviving 100% at full capacity needs 50 replicas; serving needs 100: 50 spot remain.
    assert p.on_demand_replicas == 50
    p = model.plan(workload, dataclasses.replace(policy, min_on_demand_fraction=1.0), bench)
    assert (p.on_demand_replicas, p.spot_replicas) == (100, 0)
    assert p.cost_per_hour == pytest.approx(p.all_on_demand_cost_per_hour)


def test_more_rate_never_needs_fewer_replicas(workload, policy, bench) -> None:
    rates = [0.5, 1, 3, 10, 33, 100, 333, 1000, 12345, 1e6]
    plans = model.sweep_rates(workload, policy, bench, rates)
    for a, b in itertools.pairwise(plans):
        assert b.serving_replicas >= a.serving_replicas
        assert b.total_replicas >= a.total_replicas
        assert b.on_demand_replicas >= a.on_demand_replicas
        assert b.cost_per_hour >= a.cost_per_hour


def test_longer_outputs_need_more_replicas(workload, policy, bench) -> None:
    short = model.plan(dataclasses.replace(workload, output_tokens=64), policy, bench)
    long = model.plan(dataclasses.replace(workload, output_tokens=256), policy, bench)
    assert short.capacity_rps_per_replica == pytest.approx(4.0)
    assert long.capacity_rps_per_replica == pytest.approx(1.0)
    assert long.serving_replicas == 4 * short.serving_replicas


def test_no_interruptions_no_restart_loss(workload, policy, bench) -> None:
    p = model.plan(workload, dataclasses.replace(policy, spot_interruptions_per_hour=0.0), bench)
    assert p.restart_loss_warm == 0.0 and p.restart_loss_cold == 0.0
    assert p.spot_replicas == p.serving_replicas - p.on_demand_replicas
    assert p.spot_replicas_if_cold == p.spot_replicas
    assert p.warm_cache_saving_per_hour == 0.0


def test_restart_loss_formula() -> None:
    # 0.1 interruptions/h, each costing 6 s drain + 60 s new node + 30 s ready = 96 s.
    assert model.restart_loss_fraction(
        0.1, ready_s=30, drain_s=6, replacement_delay_s=60
    ) == pytest.approx(0.1 * 96 / 3600)


def test_restart_loss_that_eats_the_replica_is_an_error() -> None:
    with pytest.raises(PlanError, match="spot cannot serve"):
        model.restart_loss_fraction(100.0, ready_s=30, drain_s=6)


def test_warm_cache_never_costs_more(workload, policy, bench) -> None:
    for rate in [0.0, 0.01, 0.1, 1.0, 5.0]:
        p = model.plan(
            workload, dataclasses.replace(policy, spot_interruptions_per_hour=rate), bench
        )
        assert p.spot_replicas <= p.spot_replicas_if_cold
        assert p.warm_cache_saving_per_hour >= 0


def test_ceil_ignores_float_noise() -> None:
    assert model.ceil(100.00000000001) == 100
    assert model.ceil(100.001) == 101
    # 0.1 * 3 / 0.1 is 3.0000000000000004 in floating point: still 3 replicas, not 4.
    assert model.serving_replicas(0.1 * 3, 0.1, 1.0) == 3


def test_choose_run_prefers_throughput_within_the_slo(bench) -> None:
    assert model.choose_run(bench.runs, None).concurrency == 64
    assert model.choose_run(bench.runs, 1.0).concurrency == 16
    with pytest.raises(PlanError, match=r"best measured: 0\.8 s"):
        model.choose_run(bench.runs, 0.5)


def test_choose_run_breaks_ties_toward_lower_concurrency() -> None:
    runs = (ServeRun("ours", 32, 0, 5.0, 1.0), ServeRun("ours", 8, 0, 5.0, 0.5))
    assert model.choose_run(runs, None).concurrency == 8


def test_runs_with_errors_do_not_count() -> None:
    runs = (ServeRun("ours", 16, 3, 9.0, 0.5), ServeRun("baseline", 16, 0, 1.0, 0.5))
    with pytest.raises(PlanError, match="no error-free 'ours' run"):
        model.choose_run(runs, None)


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("target_utilisation", 0.0, "target utilisation"),
        ("target_utilisation", 1.5, "target utilisation"),
        ("survive_fraction", -0.1, "survive fraction"),
        ("min_on_demand_fraction", 2.0, "min on-demand fraction"),
        ("spot_interruptions_per_hour", -1.0, "interruption rate"),
        ("on_demand_price_per_hour", 0.0, "prices"),
    ],
)
def test_bad_policy_is_refused(workload, policy, bench, field, value, message) -> None:
    with pytest.raises(PlanError, match=message):
        model.plan(workload, dataclasses.replace(policy, **{field: value}), bench)


def test_bad_workload_is_refused(workload, policy, bench) -> None:
    with pytest.raises(PlanError, match="target rate"):
        model.plan(dataclasses.replace(workload, target_rps=0), policy, bench)


def test_spot_share_sweep_spans_on_demand_only_to_spot_only(workload, policy, bench) -> None:
    plans = model.sweep_spot_share(workload, policy, bench, [0.0, 0.5, 1.0])
    assert [p.on_demand_replicas for p in plans] == [100, 50, 0]
    assert plans[0].spot_replicas == 0 and plans[-1].spot_share == 1.0
    costs = [p.cost_per_hour for p in plans]
    assert costs == sorted(costs, reverse=True), "spot is cheaper here, so more spot costs less"


def test_notes_flag_what_the_numbers_do_not_cover(workload, policy, bench) -> None:
    bad = dataclasses.replace(bench, requests_lost=3, drain_s=31.0)
    p = model.plan(dataclasses.replace(workload, prompt_tokens=2048), policy, bad)
    text = " ".join(p.notes)
    assert "lost 3 requests" in text
    assert "not under its 30 s deadline" in text
    assert "prefill cost is not scaled" in text
    assert model.plan(workload, policy, bench).notes == ()
