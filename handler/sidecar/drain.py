"""The drain executor: runs a DrainPlan against injected dependencies, bounded by the deadline.

Every step is recorded in a DrainReport. A failing optional step (ELB, ASG, publish) is
recorded and the drain goes on: stopping TorchServe cleanly matters more than any of them.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Protocol

from handler.sidecar.drain_plan import DEFAULT_POLICY, DrainPlan, DrainPolicy, plan_drain
from handler.sidecar.errors import SidecarError
from handler.sidecar.metrics import SidecarMetrics
from handler.sidecar.notice import Clock, TerminationNotice
from handler.torchserve.client import ModelState
from handler.torchserve.errors import TorchServeError

log = logging.getLogger(__name__)
report_log = logging.getLogger("handler.sidecar.report")

# What a failed in-flight read may raise: our typed errors, TorchServe's, requests/socket errors
# (OSError), and a malformed number from the handler's endpoint.
READ_ERRORS = (SidecarError, TorchServeError, OSError, ValueError, KeyError)

# publish_cache(publish_by_epoch) -> truthy when something new was uploaded.
CachePublisher = Callable[[float], object]


class ModelDescriber(Protocol):
    def describe(self) -> ModelState: ...


@dataclass
class DrainDeps:
    clock: Clock
    sleep: Callable[[float], None]
    stop_torchserve: Callable[[float], None]  # arg: seconds it may take
    mark_not_ready: Callable[[], None] = lambda: None
    torchserve: ModelDescriber | None = None  # queue depth from the management API
    in_flight: Callable[[], int] | None = None  # requests inside the handler, from the lead
    close_admission: Callable[[], None] | None = None  # handler starts refusing with 503
    deregister: Callable[[], None] | None = None  # ELBv2 deregister_targets, bound
    request_capacity: Callable[[], None] | None = None  # ASG desired+1 or a webhook, bound
    publish_cache: CachePublisher | None = None
    acknowledge: Callable[[TerminationNotice], None] | None = None  # Azure StartRequests
    current_deadline: Callable[[], float | None] | None = None  # NoticeBoard.deadline
    metrics: SidecarMetrics | None = None

    def optional_steps(self) -> frozenset[str]:
        present = {"close_admission": self.close_admission, "deregister": self.deregister,
                   "request_capacity": self.request_capacity, "publish": self.publish_cache,
                   "acknowledge": self.acknowledge}
        return frozenset(name for name, dep in present.items() if dep is not None)


@dataclass
class StepRecord:
    name: str
    started_epoch: float
    ended_epoch: float | None = None
    ok: bool = True
    detail: str = ""


@dataclass
class DrainReport:
    notice: TerminationNotice
    plan: DrainPlan
    steps: list[StepRecord] = field(default_factory=list)
    in_flight_at_notice: int | None = None
    in_flight_at_stop: int | None = None
    published: bool | None = None  # None: no publisher configured
    stopped: bool = False
    errors: list[str] = field(default_factory=list)
    ended_epoch: float | None = None

    @property
    def drain_seconds(self) -> float | None:
        return None if self.ended_epoch is None else self.ended_epoch - self.plan.started_epoch

    @property
    def exit_code(self) -> int:
        return 0 if self.stopped else 1

    def step(self, name: str) -> StepRecord | None:
        return next((record for record in self.steps if record.name == name), None)

    def to_json(self) -> dict[str, object]:
        return {"event": "drain_report", "notice": self.notice.to_json(),
                "plan": self.plan.to_json(), "drain_seconds": self.drain_seconds,
                "deadline_seconds": self.plan.deadline_epoch - self.plan.started_epoch,
                "in_flight_at_notice": self.in_flight_at_notice,
                "in_flight_at_stop": self.in_flight_at_stop, "published": self.published,
                "stopped": self.stopped, "exit_code": self.exit_code, "errors": self.errors,
                "steps": [vars(record) for record in self.steps]}


def run_drain(notice: TerminationNotice, deps: DrainDeps,
              policy: DrainPolicy = DEFAULT_POLICY) -> DrainReport:
    deadline = _tightest(notice.deadline_epoch, deps)
    report = DrainReport(notice, plan_drain(deadline, deps.clock(), policy, deps.optional_steps()))
    actions: dict[str, Callable[[], object] | None] = {
        "not_ready": partial(_not_ready, report, deps),
        "close_admission": deps.close_admission,
        "deregister": deps.deregister,
        "request_capacity": deps.request_capacity,
        "wait_in_flight": partial(_wait_in_flight, report, deps),
        "publish": partial(_publish, report, deps),
        "stop": partial(_stop, report, deps),
        "acknowledge": partial(deps.acknowledge, notice) if deps.acknowledge else None,
    }
    for name in report.plan.steps:
        action = actions[name]
        assert action is not None, f"step {name} planned without its dependency"
        _run_step(report, name, action, deps)
    report.ended_epoch = deps.clock()
    _record_metrics(report, deps.metrics)
    report_log.info(json.dumps(report.to_json(), default=str))
    return report


def _run_step(report: DrainReport, name: str, action: Callable[[], object],
              deps: DrainDeps) -> None:
    record = StepRecord(name, deps.clock())
    report.steps.append(record)
    try:
        action()
    except Exception as err:  # the drain's one error boundary, see the module docstring
        record.ok = False
        record.detail = f"{type(err).__name__}: {err}"
        report.errors.append(f"{name}: {record.detail}")
        log.exception("drain step %s failed", name)
        if deps.metrics is not None:
            deps.metrics.errors.labels(step=name).inc()
    finally:
        record.ended_epoch = deps.clock()


def _tightest(deadline: float, deps: DrainDeps) -> float:
    latest = deps.current_deadline() if deps.current_deadline is not None else None
    return deadline if latest is None else min(deadline, latest)


def _not_ready(report: DrainReport, deps: DrainDeps) -> None:
    deps.mark_not_ready()
    report.in_flight_at_notice, _ = _read_in_flight(deps)


def _read_in_flight(deps: DrainDeps) -> tuple[int | None, str | None]:
    """Handler in-flight plus TorchServe's queue; (None, why) when a source failed."""
    total: int | None = None
    try:
        if deps.in_flight is not None:
            total = int(deps.in_flight())
        if deps.torchserve is not None:
            pending = deps.torchserve.describe().pending_requests
            if pending is not None:
                total = (total or 0) + pending
    except READ_ERRORS as err:
        return None, f"{type(err).__name__}: {err}"
    return total, None


def _wait_in_flight(report: DrainReport, deps: DrainDeps) -> None:
    if deps.in_flight is None and deps.torchserve is None:
        return  # nothing to observe; waiting blind would only eat the publish budget
    policy = report.plan.policy
    quiet = _Quiet(policy)
    failures = 0
    while True:
        report.plan = report.plan.with_deadline(_tightest(report.plan.deadline_epoch, deps))
        count, error = _read_in_flight(deps)
        now = deps.clock()
        failures = failures + 1 if error else 0
        if failures >= policy.max_read_errors:
            raise SidecarError(f"in-flight unreadable {failures} times in a row: {error}")
        if quiet.observe(count, now):
            return
        if now >= report.plan.wait_until:
            if count:
                raise SidecarError(f"wait budget spent with {count} request(s) still in flight")
            return
        deps.sleep(min(policy.poll_interval_s, report.plan.wait_until - now,
                       quiet.time_to_go(now)))


class _Quiet:
    """Zero in flight for `quiet_s` and on `quiet_polls` reads in a row; a failed read
    (None) or any request breaks the streak."""

    def __init__(self, policy: DrainPolicy) -> None:
        self._policy = policy
        self._since: float | None = None
        self._reads = 0

    def observe(self, count: int | None, now: float) -> bool:
        if count != 0:
            self._since, self._reads = None, 0
            return False
        self._since = self._since if self._since is not None else now
        self._reads += 1
        return self._reads >= self._policy.quiet_polls and now - self._since >= self._policy.quiet_s

    def time_to_go(self, now: float) -> float:
        """How long to sleep at most: until the quiet period would be complete."""
        if self._since is None or self._reads < self._policy.quiet_polls:
            return self._policy.poll_interval_s
        return max(self._policy.quiet_s - (now - self._since), 0.0)


def _publish(report: DrainReport, deps: DrainDeps) -> None:
    assert deps.publish_cache is not None, "publish step planned without a publisher"
    report.published = False
    budget = report.plan.publish_by - deps.clock()
    if budget <= 0:
        _count_upload(deps, "skipped")
        raise SidecarError(f"no time left to publish ({budget:.1f} s)")
    outcome: dict[str, object] = {}
    # The publisher cannot be interrupted; run it aside so its overrun cannot eat the stop.
    worker = threading.Thread(target=_call_publisher, name="cache-publish", daemon=True,
                              args=(deps.publish_cache, report.plan.publish_by, outcome))
    worker.start()
    worker.join(budget)
    if worker.is_alive():
        _count_upload(deps, "timeout")
        raise TimeoutError(f"cache publisher still running after {budget:.1f} s")
    if "error" in outcome:
        _count_upload(deps, "error")
        raise outcome["error"]  # type: ignore[misc]
    report.published = bool(outcome.get("result"))
    _count_upload(deps, "published" if report.published else "unchanged")


def _call_publisher(publisher: CachePublisher, publish_by: float, out: dict[str, object]) -> None:
    try:
        out["result"] = publisher(publish_by)
    except Exception as err:  # noqa: BLE001 - crosses the thread; _publish re-raises it
        out["error"] = err


def _stop(report: DrainReport, deps: DrainDeps) -> None:
    report.in_flight_at_stop, _ = _read_in_flight(deps)
    policy = report.plan.policy
    deps.stop_torchserve(max(report.plan.stop_by - deps.clock(), policy.min_stop_s))
    report.stopped = True


def _count_upload(deps: DrainDeps, outcome: str) -> None:
    if deps.metrics is not None:
        deps.metrics.uploads.labels(outcome=outcome).inc()


def _record_metrics(report: DrainReport, metrics: SidecarMetrics | None) -> None:
    if metrics is None or report.drain_seconds is None:
        return
    metrics.drain_seconds.observe(report.drain_seconds)
    metrics.last_drain_seconds.set(report.drain_seconds)
    if report.in_flight_at_notice is not None:
        metrics.in_flight_at_notice.set(report.in_flight_at_notice)
    if report.in_flight_at_stop is not None:
        metrics.in_flight_at_stop.set(report.in_flight_at_stop)
