"""The sidecar's Prometheus metrics on /metrics: the drain's (drain/metrics.py) plus notices,
readiness, and the compile cache's restore and publish after start. On a registry the caller
owns (never the global one, so tests and two sidecars in one process do not collide)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from handler.sidecar.drain.metrics import PREFIX, DrainMetrics


class SidecarMetrics(DrainMetrics):
    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        self.notices = Counter(PREFIX + "notices", "Termination notices seen, by kind.",
                               ["kind"], registry=registry)
        self.publishes_after_start = Counter(
            PREFIX + "publishes_after_start",
            "The one cache publish once TorchServe is first ready, by outcome.", ["outcome"],
            registry=registry)
        self.cache_restores = Counter(
            PREFIX + "cache_restores",
            "The restore before TorchServe started (the restore step's record), by outcome.",
            ["outcome"], registry=registry)
        self.ready = Gauge(PREFIX + "ready", "1 while /ready answers 200.", registry=registry)
        self.termination_pending = Gauge(PREFIX + "termination_pending",
                                         "1 once a draining notice has been seen.",
                                         registry=registry)
