"""What a drain needs from the world, injected: the clock, TorchServe, and one callable per step.

A step whose dependency is None is not planned (DrainDeps.optional_steps), so a sidecar without
an ELB, an Auto Scaling group or a cache store runs a shorter drain, not a failing one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from handler.sidecar.drain.metrics import DrainMetrics
from handler.sidecar.notice.termination import Clock, TerminationNotice
from handler.torchserve.client import ModelState

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
    cut_in_flight: Callable[[], None] | None = None  # handler ends what still runs, each with a 503 / error event
    deregister: Callable[[], None] | None = None  # ELBv2 deregister_targets, bound
    request_capacity: Callable[[], None] | None = None  # ASG desired+1 or a webhook, bound
    publish_cache: CachePublisher | None = None
    close_listeners: Callable[[], list[int]] | None = None  # shut TorchServe's inference listeners; -> ports
    acknowledge: Callable[[TerminationNotice], None] | None = None  # Azure StartRequests
    current_deadline: Callable[[], float | None] | None = None  # NoticeBoard.deadline
    metrics: DrainMetrics | None = None

    def optional_steps(self) -> frozenset[str]:
        present = {"close_admission": self.close_admission, "deregister": self.deregister,
                   "request_capacity": self.request_capacity, "publish": self.publish_cache,
                   "close_listeners": self.close_listeners, "acknowledge": self.acknowledge}
        return frozenset(name for name, dep in present.items() if dep is not None)
