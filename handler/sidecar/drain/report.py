"""What a drain did: one StepRecord per step, the in-flight counts, and the exit code."""

from __future__ import annotations

from dataclasses import dataclass, field

from handler.sidecar.drain.plan import DrainPlan
from handler.sidecar.notice.termination import TerminationNotice


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
    cut_in_flight: int | None = None  # running when the wait ran out and the handler cut them (each got a 503)
    published: bool | None = None  # None: no publisher configured
    publish_seconds: float | None = None  # how long the publish (beside the wait) ran; None: unfinished
    listeners_closed: list[int] | None = None  # TorchServe's ports shut before its stop; None: not done
    stopped: bool = False
    errors: list[str] = field(default_factory=list)
    ended_epoch: float | None = None

    @property
    def drain_seconds(self) -> float | None:
        return None if self.ended_epoch is None else self.ended_epoch - self.plan.started_epoch

    @property
    def requests_cut(self) -> bool:
        """Some request did not finish: the handler cut it when the wait ran out, or it was still
        in flight when TorchServe stopped."""
        return bool(self.cut_in_flight) or bool(self.in_flight_at_stop)

    @property
    def exit_code(self) -> int:
        """0: TorchServe stopped, nothing cut; 3: stopped, but requests were cut; 1: not stopped."""
        if not self.stopped:
            return 1
        return 3 if self.requests_cut else 0

    def step(self, name: str) -> StepRecord | None:
        return next((record for record in self.steps if record.name == name), None)

    def to_json(self) -> dict[str, object]:
        return {"event": "drain_report", "notice": self.notice.to_json(),
                "plan": self.plan.to_json(), "drain_seconds": self.drain_seconds,
                "deadline_seconds": self.plan.deadline_epoch - self.plan.started_epoch,
                "in_flight_at_notice": self.in_flight_at_notice,
                "in_flight_at_stop": self.in_flight_at_stop, "cut_in_flight": self.cut_in_flight,
                "published": self.published, "publish_seconds": self.publish_seconds,
                "listeners_closed": self.listeners_closed,
                "stopped": self.stopped, "exit_code": self.exit_code, "errors": self.errors,
                "steps": [vars(record) for record in self.steps]}
