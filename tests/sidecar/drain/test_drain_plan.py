"""Drain policy arithmetic with fixed timestamps."""

from __future__ import annotations

import pytest

from handler.sidecar.drain.plan import DrainPolicy, budget_warning, plan_drain

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


def test_thirty_second_notice_shrinks_the_publish_reserve_first() -> None:
    """5 + 10 + 15 s of reserves eat a 30 s notice whole; publishing is optional, finishing
    requests is not, so the publish reserve gives the wait its minimum (5 s)."""
    plan = plan_drain(NOW + 30, NOW, POLICY, frozenset({"publish"}))
    assert plan.budget_s == 25
    assert (plan.stop_by, plan.publish_by) == (NOW + 25, NOW + 15)  # margin, stop: untouched
    assert plan.publish_reserve_s == 10
    assert (plan.wait_until, plan.wait_budget_s) == (NOW + 5, 5)
    assert plan.to_json()["publish_reserve_s"] == 10


@pytest.mark.parametrize("notice_s, reserve, wait", [
    (120, 15, 90),  # room for everything: the reserve is whole
    (35, 15, 5),  # exactly enough: 5 + 10 + 15 + 5
    (32, 12, 5),  # shrinks by what the wait lacks
    (25, 5, 5),
    (20, 0, 5),  # the publish reserve is gone; the wait still gets its 5 s
    (18, 0, 3),  # below that nothing else shrinks: margin and stop keep theirs
    (15, 0, 0),
])
def test_publish_reserve_shrinks_before_the_wait(notice_s: float, reserve: float,
                                                 wait: float) -> None:
    plan = plan_drain(NOW + notice_s, NOW, POLICY, frozenset({"publish"}))
    assert (plan.publish_reserve_s, plan.wait_budget_s) == (reserve, wait)
    assert plan.stop_by == NOW + notice_s - 5 and plan.publish_by == plan.stop_by - 10


def test_min_wait_is_a_policy_setting() -> None:
    plan = plan_drain(NOW + 30, NOW, DrainPolicy(margin_s=5, publish_reserve_s=15,
                                                 stop_reserve_s=10, min_wait_s=12),
                      frozenset({"publish"}))
    assert (plan.publish_reserve_s, plan.wait_budget_s) == (3, 12)
    no_minimum = DrainPolicy(margin_s=5, publish_reserve_s=15, stop_reserve_s=10, min_wait_s=0)
    assert plan_drain(NOW + 30, NOW, no_minimum, frozenset({"publish"})).wait_budget_s == 0


def test_a_deadline_pulled_in_during_the_wait_shrinks_the_reserve_again() -> None:
    plan = plan_drain(NOW + 120, NOW, POLICY, frozenset({"publish"}))
    assert plan.wait_until == NOW + 90
    later = plan.with_deadline(NOW + 30)  # a 30 s SIGTERM after the 2-minute notice
    assert (later.publish_reserve_s, later.wait_until) == (10, NOW + 5)


def test_without_a_publisher_there_is_no_reserve_to_shrink() -> None:
    plan = plan_drain(NOW + 30, NOW, POLICY)
    assert (plan.publish_reserve_s, plan.wait_budget_s) == (0, 15)


def test_budget_warning_names_the_keys_and_the_shrunk_reserve() -> None:
    line = budget_warning(30, "SIGTERM", "signal_grace_s", POLICY, publish=True)
    assert line == (
        "drain budget too small: a 30 s SIGTERM notice leaves 0 s for in-flight requests "
        "after drain_margin_s=5 + stop_reserve_s=10 + publish_reserve_s=15 (< min_wait_s=5); "
        "the drain shrinks the publish reserve to 10 s, so requests get 5 s. To change it, "
        "raise signal_grace_s (--signal-grace-s) or lower drain_margin_s (--drain-margin-s), "
        "stop_reserve_s (--stop-reserve-s), publish_reserve_s (--publish-reserve-s)")


@pytest.mark.parametrize("notice_s, publish, warns", [
    (30, True, True), (34.9, True, True), (35, True, False),  # 5 + 10 + 15 + min 5
    (30, False, False), (19.9, False, True), (120, True, False),
])
def test_budget_warning_threshold(notice_s: float, publish: bool, warns: bool) -> None:
    line = budget_warning(notice_s, "GCP", "gcp_notice_s", POLICY, publish)
    assert (line is not None) == warns, line


def test_budget_warning_for_a_fixed_notice_only_names_the_reserves() -> None:
    line = budget_warning(18, "AWS spot", None, POLICY, publish=False)
    assert line is not None and "raise" not in line and "publish_reserve_s" not in line
    assert line.endswith("To change it, lower drain_margin_s (--drain-margin-s), "
                         "stop_reserve_s (--stop-reserve-s)")
    assert "leaves 3 s for in-flight requests" in line and "; requests get 3 s." in line


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
