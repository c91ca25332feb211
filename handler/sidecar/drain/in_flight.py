"""The wait_in_flight step: until nothing is in flight (and stays so), or the wait budget ends.
Requests still running `cut_lead_s` before it ends are cut by the handler (DrainDeps.cut_in_flight),
each ending with a retryable error instead of the connection reset TorchServe's stop would give.

In flight = the handler's running requests (DrainDeps.in_flight) + TorchServe's queue
(DrainDeps.torchserve). The not_ready and stop steps read the same number for the report.
"""

from __future__ import annotations

from handler.sidecar.drain.deps import DrainDeps
from handler.sidecar.drain.plan import DrainPolicy
from handler.sidecar.drain.report import DrainReport
from handler.sidecar.errors import SidecarError
from handler.torchserve.errors import TorchServeError

# What a failed in-flight read may raise: our typed errors and TorchServe's, requests/socket
# errors (OSError), and a malformed number from the handler's endpoint.
READ_ERRORS = (SidecarError, TorchServeError, OSError, ValueError, KeyError)


def tightest(deadline: float, deps: DrainDeps) -> float:
    """The deadline, pulled in by any later notice on the board (they only move in)."""
    latest = deps.current_deadline() if deps.current_deadline is not None else None
    return deadline if latest is None else min(deadline, latest)


def read_in_flight(deps: DrainDeps) -> tuple[int | None, str | None]:
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


def wait_in_flight(report: DrainReport, deps: DrainDeps) -> None:
    if deps.in_flight is None and deps.torchserve is None:
        return  # nothing to observe; waiting blind would only eat the publish budget
    policy = report.plan.policy
    quiet = _Quiet(policy)
    failures = 0
    while True:
        report.plan = report.plan.with_deadline(tightest(report.plan.deadline_epoch, deps))
        count, error = read_in_flight(deps)
        now = deps.clock()
        failures = failures + 1 if error else 0
        if failures >= policy.max_read_errors:
            raise SidecarError(f"in-flight unreadable {failures} times in a row: {error}")
        if quiet.observe(count, now) or (now >= report.plan.wait_until and not count):
            if report.cut_in_flight:  # none left, but not because they finished
                raise SidecarError(f"wait budget spent: {report.cut_in_flight} request(s) were cut, each ending "
                                   "with a retryable error")
            return
        may_cut = deps.cut_in_flight is not None and report.cut_in_flight is None
        cut_at = report.plan.wait_until - policy.cut_lead_s
        if count and may_cut and now >= cut_at and deps.cut_in_flight is not None:
            deps.cut_in_flight()
            report.cut_in_flight = count
        if now >= report.plan.wait_until:
            raise SidecarError(f"wait budget spent with {count} request(s) still in flight")
        wake = [policy.poll_interval_s, report.plan.wait_until - now, quiet.time_to_go(now)]
        if may_cut and now < cut_at:
            wake.append(cut_at - now)
        deps.sleep(min(wake))


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
