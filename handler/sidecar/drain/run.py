"""The drain executor: runs a DrainPlan's steps in order, bounded by the deadline.

The cache publish starts with the drain and runs beside the steps (publish.py); the publish
step only waits for it. Every step is recorded in a DrainReport. A failing optional step (ELB, ASG, publish) is
recorded and the drain goes on: stopping TorchServe cleanly matters more than any of them.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from functools import partial

from handler.sidecar.drain.deps import DrainDeps
from handler.sidecar.drain.in_flight import read_in_flight, tightest, wait_in_flight
from handler.sidecar.drain.metrics import DrainMetrics
from handler.sidecar.drain.plan import DEFAULT_POLICY, DrainPolicy, plan_drain
from handler.sidecar.drain.publish import publish, start_publish
from handler.sidecar.drain.report import DrainReport, StepRecord
from handler.sidecar.notice.termination import TerminationNotice

log = logging.getLogger(__name__)
report_log = logging.getLogger("handler.sidecar.report")


def run_drain(notice: TerminationNotice, deps: DrainDeps,
              policy: DrainPolicy = DEFAULT_POLICY) -> DrainReport:
    deadline = tightest(notice.deadline_epoch, deps)
    report = DrainReport(notice, plan_drain(deadline, deps.clock(), policy, deps.optional_steps()))
    # Beside the wait, not after it: the upload takes no time from in-flight requests.
    publishing = start_publish(report, deps)
    actions: dict[str, Callable[[], object] | None] = {
        "not_ready": partial(_not_ready, report, deps),
        "close_admission": deps.close_admission,
        "deregister": deps.deregister,
        "request_capacity": deps.request_capacity,
        "wait_in_flight": partial(wait_in_flight, report, deps),
        "publish": partial(publish, report, deps, publishing),
        "close_listeners": partial(_close_listeners, report, deps),
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


def _not_ready(report: DrainReport, deps: DrainDeps) -> None:
    deps.mark_not_ready()
    report.in_flight_at_notice, _ = read_in_flight(deps)


def _close_listeners(report: DrainReport, deps: DrainDeps) -> None:
    assert deps.close_listeners is not None, "planned without its dependency"
    report.listeners_closed = deps.close_listeners()
    deps.sleep(report.plan.policy.listener_settle_s)


def _stop(report: DrainReport, deps: DrainDeps) -> None:
    report.in_flight_at_stop, _ = read_in_flight(deps)
    policy = report.plan.policy
    deps.stop_torchserve(max(report.plan.stop_by - deps.clock(), policy.min_stop_s))
    report.stopped = True


def _record_metrics(report: DrainReport, metrics: DrainMetrics | None) -> None:
    if metrics is None or report.drain_seconds is None:
        return
    metrics.drain_seconds.observe(report.drain_seconds)
    metrics.last_drain_seconds.set(report.drain_seconds)
    if report.in_flight_at_notice is not None:
        metrics.in_flight_at_notice.set(report.in_flight_at_notice)
    if report.in_flight_at_stop is not None:
        metrics.in_flight_at_stop.set(report.in_flight_at_stop)
