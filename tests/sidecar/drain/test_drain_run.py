"""The drain executor, with a fake clock and fakes for TorchServe and the cloud calls."""

from __future__ import annotations

import json
import logging
import threading
import time

import pytest
from prometheus_client import CollectorRegistry

from handler.sidecar.drain.deps import DrainDeps
from handler.sidecar.drain.plan import DrainPolicy
from handler.sidecar.drain.run import run_drain
from handler.sidecar.endpoints.sidecar_metrics import SidecarMetrics
from handler.sidecar.errors import CapacityError
from handler.sidecar.notice.termination import NoticeKind, TerminationNotice
from handler.torchserve.client import ModelState, WorkerInfo
from handler.torchserve.errors import TorchServeError

POLICY = DrainPolicy(margin_s=5, stop_reserve_s=10, poll_interval_s=0.5,
                     quiet_s=1.0)


def notice(deadline: float) -> TerminationNotice:
    return TerminationNotice(NoticeKind.SPOT_INTERRUPTION, "aws", deadline,
                             {"action": "terminate"})


class Sequence:
    """Returns the given values in turn, then repeats the last one."""

    def __init__(self, *values: int) -> None:
        self.values = list(values)

    def __call__(self) -> int:
        return self.values.pop(0) if len(self.values) > 1 else self.values[0]


class Queue:
    def __init__(self, *pending: int) -> None:
        self.pending = Sequence(*pending)

    def describe(self) -> ModelState:
        return ModelState("llm", (WorkerInfo("9000", "READY", 1),), self.pending())


class Calls:
    """Records which dependency ran, and when on the fake clock."""

    def __init__(self, clock) -> None:
        self.clock = clock
        self.log: list[tuple[str, float]] = []

    def __call__(self, name: str, result: object = None):
        def call(*args: object) -> object:
            self.log.append((name, self.clock()))
            return result
        return call

    def at(self, name: str) -> float:
        return dict(self.log)[name]

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self.log]


def deps(clock, calls: Calls, **overrides) -> DrainDeps:
    base = dict(clock=clock, sleep=clock.sleep, stop_torchserve=calls("stop"),
                mark_not_ready=calls("not_ready"))
    return DrainDeps(**{**base, **overrides})


def test_steps_run_in_order(clock) -> None:
    calls = Calls(clock)
    start = clock()
    report = run_drain(notice(clock() + 120), deps(
        clock, calls, close_admission=calls("close_admission"), deregister=calls("deregister"),
        request_capacity=calls("request_capacity"), in_flight=Sequence(0),
        publish_cache=calls("publish", True), acknowledge=calls("acknowledge")), POLICY)
    order = ["not_ready", "close_admission", "deregister", "request_capacity", "stop",
             "acknowledge"]
    # The publisher runs in the background from the start, not between the steps.
    assert [name for name in calls.names if name != "publish"] == order
    assert calls.names.count("publish") == 1 and calls.at("publish") == start
    assert [step.name for step in report.steps] == [*order[:4], "wait_in_flight", "publish", *order[4:]]
    assert report.published is True and report.stopped and report.exit_code == 0
    assert report.errors == []


def test_waits_for_in_flight_to_reach_zero_and_stay_there(clock) -> None:
    calls = Calls(clock)
    start = clock()
    report = run_drain(notice(start + 120), deps(clock, calls, in_flight=Sequence(3, 2, 1, 0)),
                       POLICY)
    # reads: 3 at the notice, then 2, 1 and the first 0 at +1.0 s, confirmed 1 s (quiet_s) later
    assert calls.at("stop") - start == pytest.approx(2.0)
    assert (report.in_flight_at_notice, report.in_flight_at_stop) == (3, 0)


def test_a_request_arriving_in_the_quiet_period_restarts_it(clock) -> None:
    calls = Calls(clock)
    start = clock()
    run_drain(notice(start + 120), deps(clock, calls, in_flight=Sequence(0, 0, 1, 0)), POLICY)
    assert calls.at("stop") - start == pytest.approx(2.0)  # 1.0 had the 1 not come at +0.5 s


def test_torchserve_queue_counts_as_in_flight(clock) -> None:
    calls = Calls(clock)
    start = clock()
    report = run_drain(notice(start + 120), deps(clock, calls, torchserve=Queue(4, 4, 0),
                                                 in_flight=Sequence(1, 0)), POLICY)
    assert report.in_flight_at_notice == 5  # 1 in the handler + 4 queued
    assert calls.at("stop") - start == pytest.approx(1.5)  # 4 at +0 s, 0 from +0.5 s


def test_wait_budget_runs_out_and_stop_still_happens(clock) -> None:
    calls = Calls(clock)
    start = clock()
    report = run_drain(notice(start + 120), deps(clock, calls, in_flight=Sequence(5)), POLICY)
    assert calls.at("stop") - start == pytest.approx(105)  # 120 - 5 margin - 10 stop
    assert report.step("wait_in_flight").ok is False
    assert report.in_flight_at_stop == 5 and report.stopped
    assert any("still in flight" in error for error in report.errors)


def test_requests_still_running_near_the_end_of_the_wait_are_cut(clock) -> None:
    calls = Calls(clock)
    start = clock()
    def running() -> int:  # 3 until the handler cuts them
        return 0 if "cut" in calls.names else 3

    report = run_drain(notice(start + 120), deps(clock, calls, in_flight=running, cut_in_flight=calls("cut")), POLICY)
    assert calls.at("cut") - start == pytest.approx(104)  # wait ends at 105; cut_lead_s 1 before
    assert report.cut_in_flight == 3 and report.in_flight_at_stop == 0 and report.stopped
    assert report.exit_code == 3  # stopped cleanly, but not everything finished
    assert "3 request(s) were cut, each ending with a retryable error" in report.step("wait_in_flight").detail


def test_no_cut_when_everything_finished_in_time(clock) -> None:
    calls = Calls(clock)
    report = run_drain(notice(clock() + 120), deps(clock, calls, in_flight=Sequence(2, 0), cut_in_flight=calls("cut")),
                       POLICY)
    assert "cut" not in calls.names and report.cut_in_flight is None and report.step("wait_in_flight").ok


def test_nothing_to_observe_means_no_wait(clock) -> None:
    calls = Calls(clock)
    start = clock()
    run_drain(notice(start + 120), deps(clock, calls), POLICY)
    assert calls.at("stop") == start


def test_no_publisher_no_publish_step(clock) -> None:
    report = run_drain(notice(clock() + 120), deps(clock, Calls(clock)), POLICY)
    assert report.published is None and report.step("publish") is None


def test_publisher_gets_its_deadline(clock) -> None:
    seen: list[float] = []
    start = clock()
    run_drain(notice(start + 120), deps(clock, Calls(clock), publish_cache=seen.append), POLICY)
    assert [t - start for t in seen] == [105]  # deadline - margin - stop reserve


def test_publisher_failure_is_recorded_and_stop_still_runs(clock) -> None:
    calls = Calls(clock)
    metrics = SidecarMetrics(CollectorRegistry())

    def broken(deadline: float) -> bool:
        raise OSError("bucket unreachable")

    report = run_drain(notice(clock() + 120), deps(clock, calls, publish_cache=broken,
                                                   metrics=metrics), POLICY)
    assert "stop" in calls.names and report.stopped
    assert report.published is False and report.errors == ["publish: OSError: bucket unreachable"]
    assert metrics.uploads.labels(outcome="error")._value.get() == 1
    assert metrics.errors.labels(step="publish")._value.get() == 1


def test_hung_publisher_is_abandoned_at_its_deadline() -> None:
    """The publisher cannot be interrupted; the drain must still stop TorchServe in time."""
    release = threading.Event()
    stopped_at: list[float] = []
    start = time.time()
    policy = DrainPolicy(margin_s=0.1, stop_reserve_s=0.2)
    report = run_drain(notice(start + 0.6), DrainDeps(
        clock=time.time, sleep=time.sleep, stop_torchserve=lambda t: stopped_at.append(time.time()),
        publish_cache=lambda deadline: release.wait(10)), policy)
    release.set()
    assert report.published is False and "TimeoutError" in report.step("publish").detail
    assert stopped_at[0] - start < 0.6


def test_deadline_too_close_skips_publish(clock) -> None:
    calls = Calls(clock)
    report = run_drain(notice(clock() + 12), deps(clock, calls,
                                                  publish_cache=calls("publish")), POLICY)
    assert "publish" not in calls.names and "stop" in calls.names
    assert "no time left to publish" in report.step("publish").detail


def test_optional_step_failure_does_not_stop_the_drain(clock) -> None:
    calls = Calls(clock)

    def deregister() -> None:
        raise CapacityError("target group gone")

    report = run_drain(notice(clock() + 120), deps(clock, calls, deregister=deregister,
                                                   request_capacity=calls("capacity")), POLICY)
    assert calls.names == ["not_ready", "capacity", "stop"]
    assert report.step("deregister").ok is False and report.exit_code == 0


def test_requests_still_in_flight_at_the_stop_give_exit_code_3(clock) -> None:
    report = run_drain(notice(clock() + 120), deps(clock, Calls(clock), in_flight=Sequence(4)), POLICY)
    assert report.stopped and report.in_flight_at_stop == 4 and report.exit_code == 3


def test_failed_stop_gives_exit_code_1(clock) -> None:
    def stop(timeout_s: float) -> None:
        raise TorchServeError("did not exit")

    report = run_drain(notice(clock() + 120), deps(clock, Calls(clock), stop_torchserve=stop),
                       POLICY)
    assert report.stopped is False and report.exit_code == 1


def test_stop_gets_the_time_left_but_at_least_min_stop(clock) -> None:
    budgets: list[float] = []
    run_drain(notice(clock() + 120), deps(clock, Calls(clock), stop_torchserve=budgets.append),
              POLICY)
    run_drain(notice(clock() - 60), deps(clock, Calls(clock), stop_torchserve=budgets.append),
              POLICY)
    assert budgets == [115, POLICY.min_stop_s]


def test_sigterm_after_spot_notice_pulls_the_deadline_in(clock) -> None:
    """A kubelet SIGTERM (30 s grace) after a 2-minute spot notice wins."""
    calls = Calls(clock)
    start = clock()
    tighter = {"deadline": None}

    def in_flight() -> int:
        if clock() >= start + 2:
            tighter["deadline"] = start + 32  # SIGTERM received at +2 s
        return 1

    report = run_drain(notice(start + 120), deps(clock, calls, in_flight=in_flight,
                                                 current_deadline=lambda: tighter["deadline"]),
                       POLICY)
    assert calls.at("stop") - start == pytest.approx(17)  # 32 - 5 - 10
    assert report.plan.deadline_epoch == start + 32


def test_unreadable_in_flight_gives_up_after_repeated_errors(clock) -> None:
    calls = Calls(clock)
    start = clock()

    def broken() -> int:
        raise TorchServeError("connection refused")

    report = run_drain(notice(start + 120), deps(clock, calls, in_flight=broken), POLICY)
    assert calls.at("stop") - start == pytest.approx(2.0)  # 5 reads, 0.5 s apart
    assert report.in_flight_at_notice is None
    assert "unreadable 5 times" in report.step("wait_in_flight").detail


def test_report_is_one_json_line_and_metrics_are_set(clock, caplog) -> None:
    metrics = SidecarMetrics(CollectorRegistry())
    with caplog.at_level(logging.INFO, logger="handler.sidecar.report"):
        run_drain(notice(clock() + 120), deps(clock, Calls(clock), in_flight=Sequence(2, 0),
                                              metrics=metrics), POLICY)
    (line,) = [r.getMessage() for r in caplog.records if r.name == "handler.sidecar.report"]
    report = json.loads(line)
    assert "\n" not in line and report["event"] == "drain_report"
    assert report["drain_seconds"] == pytest.approx(1.0)  # zeros from +0 s, quiet for 1 s
    assert report["deadline_seconds"] == 120 and report["in_flight_at_notice"] == 2
    assert metrics.drain_seconds._sum.get() == pytest.approx(1.0)
    assert metrics.in_flight_at_notice._value.get() == 2
    assert metrics.in_flight_at_stop._value.get() == 0


def test_zero_must_be_read_on_quiet_polls_reads_in_a_row(clock) -> None:
    # The handler's running gauge reaches TorchServe's metrics through the worker log; one
    # zero may be stale. With quiet_s 0 only the count of reads decides.
    calls = Calls(clock)
    start = clock()
    policy = DrainPolicy(margin_s=5, stop_reserve_s=10,
                         poll_interval_s=0.5, quiet_s=0.0, quiet_polls=3)
    # notice read, then 0 (1st), 2 (breaks the streak), 0, 0, 0 (3rd in a row at +2.0 s)
    run_drain(notice(start + 120), deps(clock, calls, in_flight=Sequence(5, 0, 2, 0, 0, 0)),
              policy)
    assert calls.at("stop") - start == pytest.approx(2.0)


def test_an_unreadable_poll_breaks_the_quiet_streak(clock) -> None:
    calls = Calls(clock)
    start = clock()
    values = iter([0, 0, None, 0, 0])

    def flaky() -> int:
        value = next(values, 0)
        if value is None:
            raise TorchServeError("metrics endpoint hiccup")
        return value

    policy = DrainPolicy(margin_s=5, stop_reserve_s=10,
                         poll_interval_s=0.5, quiet_s=0.0, quiet_polls=2)
    report = run_drain(notice(start + 120), deps(clock, calls, in_flight=flaky), policy)
    # notice read 0; wait reads 0, error, 0, 0 -> done at the 2nd zero after the error (+1.5 s)
    assert calls.at("stop") - start == pytest.approx(1.5)
    assert report.errors == []


def test_the_publish_runs_beside_the_wait_which_gets_the_whole_budget(clock) -> None:
    """A 30 s notice with reserves 5 + 10: the wait gets all 15 s before publish_by, and the
    publish, started with the drain, has ended by the time the wait does."""
    calls = Calls(clock)
    start = clock()
    published = threading.Event()
    publish_seen: list[tuple[float, float]] = []

    def publisher(by: float) -> bool:
        publish_seen.append((clock(), by))
        published.set()
        return True

    def in_flight() -> int:  # a request that never finishes; first read once the publish ran
        assert published.wait(5), "the publish did not start with the drain"
        return 3

    report = run_drain(notice(start + 30), deps(clock, calls, in_flight=in_flight,
                                                publish_cache=publisher), POLICY)
    assert report.plan.wait_until == start + 15 and report.plan.wait_budget_s == 15
    assert publish_seen == [(start, start + 15)]  # at the start, told its bound
    wait = report.step("wait_in_flight")
    assert not wait.ok and "wait budget spent with 3 request(s)" in wait.detail
    assert wait.ended_epoch == pytest.approx(start + 15)
    assert report.step("publish").ok and report.published is True
    assert report.publish_seconds is not None
    assert calls.at("stop") == pytest.approx(start + 15)


def test_the_publish_step_waits_for_a_publish_still_running_after_the_wait() -> None:
    """Nothing in flight: the wait ends at once, and the publish step waits for the upload
    (up to publish_by) before the stop."""
    start = time.time()
    stopped_at: list[float] = []
    policy = DrainPolicy(margin_s=0.1, stop_reserve_s=0.2)
    report = run_drain(notice(start + 2.0), DrainDeps(
        clock=time.time, sleep=time.sleep, stop_torchserve=lambda t: stopped_at.append(time.time()),
        publish_cache=lambda by: time.sleep(0.3) or True), policy)
    assert report.published is True and report.step("publish").ok
    assert report.publish_seconds == pytest.approx(0.3, abs=0.2)
    assert 0.25 <= stopped_at[0] - start < 1.7


def test_listeners_are_closed_just_before_the_stop_then_given_time_to_answer(clock) -> None:
    calls = Calls(clock)
    report = run_drain(notice(clock() + 120), deps(
        clock, calls, in_flight=Sequence(0), close_listeners=calls("close_listeners", [8080, 7070])))
    assert calls.names[-2:] == ["close_listeners", "stop"]
    assert calls.at("stop") - calls.at("close_listeners") >= POLICY.listener_settle_s
    assert report.listeners_closed == [8080, 7070] and report.to_json()["listeners_closed"] == [8080, 7070]


def test_a_listener_close_that_fails_is_reported_and_the_stop_still_runs(clock) -> None:
    calls = Calls(clock)

    def refused() -> list[int]:
        raise PermissionError(1, "pidfd_getfd: Operation not permitted")

    report = run_drain(notice(clock() + 120), deps(clock, calls, in_flight=Sequence(0), close_listeners=refused))
    assert calls.names[-1] == "stop" and report.stopped
    assert report.listeners_closed is None
    assert any(error.startswith("close_listeners: PermissionError") for error in report.errors)
