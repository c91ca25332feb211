"""The drain policy as pure arithmetic: deadline, margin and now in; budget and steps out.

Timeline, all epochs (s):

    started ......................... wait_until = publish_by ... stop_by ... deadline
        wait for in-flight requests                           | stop TorchServe | margin
        cache publish (in the background, from the start) ---|

Replacement capacity is asked for before the wait, not after: a new instance takes minutes
to boot, so asking late only widens the gap in serving capacity.

The cache publish runs beside the in-flight wait, started with the drain (publish.py): it takes
no time from requests, and the publish step after the wait only waits for it until publish_by,
so an upload that overruns cannot eat the stop reserve. The margin and the stop reserve never
shrink; everything before them is the wait's. `min_wait_s` is only the threshold of the
start-up warning (budget_warning) for a notice that leaves the wait less than that.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

STEP_ORDER = ("not_ready", "close_admission", "deregister", "request_capacity",
              "wait_in_flight", "publish", "close_listeners", "stop", "acknowledge")
ALWAYS = frozenset({"not_ready", "wait_in_flight", "stop"})


@dataclass(frozen=True)
class DrainPolicy:
    # Everything done this long before the deadline. Deadlines are the platform's own times (a
    # signal's grace, IMDS/GCP/Azure event times, clocks NTP-synced), so a second covers the
    # report and the last acknowledgement; the stop reserve has its own slack.
    margin_s: float = 1.0
    stop_reserve_s: float = 10.0  # kept free for TorchServe's shutdown hook
    poll_interval_s: float = 0.5
    # In-flight must read zero this long: requests keep arriving until load balancers and
    # EndpointSlices have seen the 503 from /ready.
    quiet_s: float = 1.0
    # ...and on this many reads in a row: the handler's running gauge reaches TorchServe's
    # metrics endpoint through the worker's log, a moment after the fact.
    quiet_polls: int = 2
    # A notice that leaves the in-flight wait less than this is warned about at start.
    min_wait_s: float = 5.0
    # stop gets at least this much even when the deadline has passed: above TorchServe's clean
    # shutdown (2.45-2.93 s in every graceful stop measured on 2 cores), else it is SIGKILLed (the
    # stop then removes the .mar it unpacked: handler/torchserve/stop.py)
    min_stop_s: float = 5.0
    max_read_errors: int = 5  # consecutive failed in-flight reads before giving up the wait
    # Requests still running this long before the wait ends are cut by the handler (DrainDeps.
    # cut_in_flight), each ending with a retryable error the client reads, not a connection reset.
    cut_lead_s: float = 1.0
    # After TorchServe's listeners are shut, the connections it accepted just before get their
    # answers (the drain's 503, one worker round trip) before SIGTERM closes them.
    listener_settle_s: float = 0.5

    def __post_init__(self) -> None:
        for name in ("margin_s", "stop_reserve_s", "quiet_s", "min_wait_s",
                     "min_stop_s", "cut_lead_s", "listener_settle_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"DrainPolicy.{name} must be >= 0, got {getattr(self, name)}")
        if self.poll_interval_s <= 0:
            raise ValueError(f"DrainPolicy.poll_interval_s must be > 0, got {self.poll_interval_s}")
        if self.quiet_polls < 1:
            raise ValueError(f"DrainPolicy.quiet_polls must be >= 1, got {self.quiet_polls}")


DEFAULT_POLICY = DrainPolicy()


@dataclass(frozen=True)
class DrainPlan:
    started_epoch: float
    deadline_epoch: float
    policy: DrainPolicy
    steps: tuple[str, ...]

    @property
    def stop_by(self) -> float:
        return self.deadline_epoch - self.policy.margin_s

    @property
    def publish_by(self) -> float:
        return self.stop_by - self.policy.stop_reserve_s

    @property
    def wait_until(self) -> float:
        """The publish runs beside the wait (module docstring): nothing is kept for it here."""
        return max(self.started_epoch, self.publish_by)

    @property
    def budget_s(self) -> float:
        """Time from the start to `stop_by`; negative when the notice came too late."""
        return self.stop_by - self.started_epoch

    @property
    def wait_budget_s(self) -> float:
        return self.wait_until - self.started_epoch

    def with_deadline(self, deadline_epoch: float) -> DrainPlan:
        """Deadlines only move in: a later notice cannot buy more time than an earlier one."""
        return dataclasses.replace(self, deadline_epoch=min(self.deadline_epoch, deadline_epoch))

    def to_json(self) -> dict[str, object]:
        return {"started_epoch": self.started_epoch, "deadline_epoch": self.deadline_epoch,
                "budget_s": self.budget_s, "wait_until": self.wait_until,
                "publish_by": self.publish_by, "stop_by": self.stop_by,
                "steps": list(self.steps), "policy": dataclasses.asdict(self.policy)}


def plan_drain(deadline_epoch: float, now: float, policy: DrainPolicy,
               optional_steps: frozenset[str] = frozenset()) -> DrainPlan:
    unknown = optional_steps - set(STEP_ORDER)
    if unknown:
        raise ValueError(f"unknown drain steps {sorted(unknown)}; known: {STEP_ORDER}")
    wanted = ALWAYS | optional_steps
    steps = tuple(step for step in STEP_ORDER if step in wanted)
    return DrainPlan(now, deadline_epoch, policy, steps)


def budget_warning(notice_s: float, source: str, setting: str | None,
                   policy: DrainPolicy) -> str | None:
    """A WARNING line when a notice of notice_s leaves the in-flight wait less than min_wait_s;
    None when it fits. `setting`: the key that sets notice_s (signal_grace_s, gcp_notice_s,
    ...), None when the cloud fixes it. The cache publish takes nothing from the wait."""
    wait = notice_s - policy.margin_s - policy.stop_reserve_s
    if wait >= policy.min_wait_s:
        return None
    reserves = f"drain_margin_s={policy.margin_s:g} + stop_reserve_s={policy.stop_reserve_s:g}"
    fix = f"raise {setting} (--{setting.replace('_', '-')}) or lower " if setting else "lower "
    return (f"drain budget too small: a {notice_s:g} s {source} notice leaves {max(wait, 0):g} s "
            f"for in-flight requests after {reserves} (< min_wait_s={policy.min_wait_s:g}). "
            f"To change it, {fix}drain_margin_s (--drain-margin-s), stop_reserve_s "
            "(--stop-reserve-s; a stop measured here or by the fleet replaces it)")
