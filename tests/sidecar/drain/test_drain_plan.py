"""Drain policy arithmetic with fixed timestamps."""

from __future__ import annotations

import pytest

from handler.sidecar.drain.plan import DrainPolicy, budget_warning, plan_drain

NOW = 1_800_000_000.0
POLICY = DrainPolicy(margin_s=5, stop_reserve_s=10)


def test_two_minute_notice_budget() -> None:
    plan = plan_drain(NOW + 120, NOW, POLICY, frozenset({"publish"}))
    assert plan.budget_s == 115
    assert (plan.stop_by, plan.publish_by, plan.wait_until) == (NOW + 115, NOW + 105, NOW + 105)
    assert plan.wait_budget_s == 105


@pytest.mark.parametrize("steps", [frozenset(), frozenset({"publish"})])
def test_the_publish_takes_nothing_from_the_wait(steps: frozenset[str]) -> None:
    """The publish runs beside the wait (publish.py): with or without it, the wait gets
    everything before the stop reserve."""
    plan = plan_drain(NOW + 30, NOW, POLICY, steps)
    assert (plan.stop_by, plan.publish_by) == (NOW + 25, NOW + 15)
    assert (plan.wait_until, plan.wait_budget_s) == (NOW + 15, 15)
    assert "publish_reserve_s" not in plan.to_json() and "publish_reserve_s" not in plan.to_json()["policy"]


def test_a_thirty_second_grace_with_a_cache_store_and_a_measured_stop() -> None:
    """Issue 41 item 5: margin 1 + stop 10 + publish 15 left 4 s of a 30 s grace. With a
    measured 2.5 s stop (reserve 3.5 s) and the publish beside the wait, the wait gets 25.5 s."""
    from handler.sidecar.drain.stop_record import stop_reserve

    policy = DrainPolicy(margin_s=1, stop_reserve_s=stop_reserve([2.5], 10.0))
    plan = plan_drain(NOW + 30, NOW, policy, frozenset({"publish"}))
    assert plan.wait_budget_s == pytest.approx(25.5)
    default = plan_drain(NOW + 30, NOW, DrainPolicy(margin_s=1), frozenset({"publish"}))
    assert default.wait_budget_s == 19  # no measured stop anywhere yet


def test_min_wait_does_not_change_the_plan() -> None:
    """min_wait_s is only the start-up warning's threshold: no reserve is left to shrink."""
    for min_wait in (0, 12, 50):
        policy = DrainPolicy(margin_s=5, stop_reserve_s=10, min_wait_s=min_wait)
        assert plan_drain(NOW + 30, NOW, policy, frozenset({"publish"})).wait_budget_s == 15


def test_a_deadline_pulled_in_during_the_wait_moves_the_wait_end() -> None:
    plan = plan_drain(NOW + 120, NOW, POLICY, frozenset({"publish"}))
    assert plan.wait_until == NOW + 105
    later = plan.with_deadline(NOW + 30)  # a 30 s SIGTERM after the 2-minute notice
    assert (later.publish_by, later.wait_until) == (NOW + 15, NOW + 15)


def test_budget_warning_names_the_keys() -> None:
    line = budget_warning(18, "SIGTERM", "signal_grace_s", POLICY)
    assert line == (
        "drain budget too small: a 18 s SIGTERM notice leaves 3 s for in-flight requests "
        "after drain_margin_s=5 + stop_reserve_s=10 (< min_wait_s=5). To change it, "
        "raise signal_grace_s (--signal-grace-s) or lower drain_margin_s (--drain-margin-s), "
        "stop_reserve_s (--stop-reserve-s; a stop measured here or by the fleet replaces it)")


@pytest.mark.parametrize("notice_s, warns", [
    (30, False), (20, False), (19.9, True), (10, True), (120, False),  # 5 + 10 + min 5
])
def test_budget_warning_threshold(notice_s: float, warns: bool) -> None:
    line = budget_warning(notice_s, "GCP", "gcp_notice_s", POLICY)
    assert (line is not None) == warns, line


def test_budget_warning_for_a_fixed_notice_only_names_the_reserves() -> None:
    line = budget_warning(18, "AWS spot", None, POLICY)
    assert line is not None and "raise" not in line and "publish_reserve_s" not in line
    assert "To change it, lower drain_margin_s (--drain-margin-s), stop_reserve_s" in line
    assert "leaves 3 s for in-flight requests" in line


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


def test_negative_min_wait_rejected() -> None:
    with pytest.raises(ValueError, match="min_wait_s"):
        DrainPolicy(min_wait_s=-1)
