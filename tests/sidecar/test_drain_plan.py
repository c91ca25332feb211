"""Drain policy arithmetic with fixed timestamps."""

from __future__ import annotations

import pytest

from handler.sidecar.drain_plan import DrainPolicy, plan_drain

NOW = 1_800_000_000.0
POLICY = DrainPolicy(margin_s=5, publish_reserve_s=15, stop_reserve_s=10)


def test_two_minute_notice_budget() -> None:
    plan = plan_drain(NOW + 120, NOW, POLICY, frozenset({"publish"}))
    assert plan.budget_s == 115
    assert (plan.stop_by, plan.publish_by, plan.wait_until) == (NOW + 115, NOW + 105, NOW + 90)
    assert plan.wait_budget_s == 90


def test_without_a_publisher_the_wait_keeps_the_publish_reserve() -> None:
    plan = plan_drain(NOW + 120, NOW, POLICY)
    assert plan.wait_until == NOW + 105


def test_thirty_second_notice_leaves_no_wait_when_reserves_exceed_it() -> None:
    plan = plan_drain(NOW + 30, NOW, POLICY, frozenset({"publish"}))
    assert plan.wait_until == NOW  # clamped: reserves (5+10+15) eat the whole notice
    assert plan.wait_budget_s == 0 and plan.budget_s == 25


def test_deadline_already_past_gives_negative_budget() -> None:
    plan = plan_drain(NOW - 10, NOW, POLICY)
    assert plan.budget_s == -15 and plan.wait_until == NOW


def test_steps_are_ordered_and_only_the_enabled_ones() -> None:
    plan = plan_drain(NOW + 120, NOW, POLICY,
                      frozenset({"acknowledge", "publish", "deregister", "request_capacity"}))
    assert plan.steps == ("not_ready", "deregister", "request_capacity", "wait_in_flight",
                          "publish", "stop", "acknowledge")


def test_deadline_only_moves_in() -> None:
    plan = plan_drain(NOW + 120, NOW, POLICY)
    assert plan.with_deadline(NOW + 30).deadline_epoch == NOW + 30
    assert plan.with_deadline(NOW + 300).deadline_epoch == NOW + 120


def test_unknown_step_rejected() -> None:
    with pytest.raises(ValueError, match="unknown drain steps"):
        plan_drain(NOW + 120, NOW, POLICY, frozenset({"reboot"}))


def test_negative_margin_rejected() -> None:
    with pytest.raises(ValueError, match="margin_s"):
        DrainPolicy(margin_s=-1)
