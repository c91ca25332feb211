"""The drain's Prometheus metrics: how long drains take, what was in flight, uploads, errors.

The sidecar's full set (endpoints/sidecar_metrics.py) extends these; both live on a registry
the caller owns (never the global one, so tests and two sidecars in one process do not collide).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

PREFIX = "ts_llm_sidecar_"
# Spot notices give 30 s (GCP, Azure) to 120 s (AWS); buckets resolve that range.
DRAIN_BUCKETS = (1, 2, 5, 10, 15, 20, 30, 45, 60, 90, 120, 180, 300)


class DrainMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.drain_seconds = Histogram(PREFIX + "drain_duration_seconds",
                                       "Time from drain start to TorchServe stopped.",
                                       buckets=DRAIN_BUCKETS, registry=registry)
        self.last_drain_seconds = Gauge(PREFIX + "last_drain_duration_seconds",
                                        "Duration of the most recent drain.", registry=registry)
        self.in_flight_at_notice = Gauge(PREFIX + "in_flight_at_notice",
                                         "Requests in flight or queued when the notice came.",
                                         registry=registry)
        self.in_flight_at_stop = Gauge(PREFIX + "in_flight_at_stop",
                                       "Requests in flight or queued when TorchServe was stopped.",
                                       registry=registry)
        self.uploads = Counter(PREFIX + "uploads", "Cache publish attempts, by outcome.",
                               ["outcome"], registry=registry)
        self.errors = Counter(PREFIX + "errors", "Errors, by drain step or watcher.",
                              ["step"], registry=registry)
