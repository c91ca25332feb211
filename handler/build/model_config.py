"""The model-config.yaml packed into a .mar: TorchServe's frontend keys plus our `handler:` section."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ServingOptions:
    batching: str = "continuous"  # "continuous" or "dynamic" (batchSize/maxBatchDelay)
    batch_size: int = 16  # requests decoded together (continuous) or one batch's size (dynamic)
    max_batch_delay_ms: int = 10
    workers: int = 1
    response_timeout_s: int = 600
    startup_timeout_s: int = 900  # compile (cold) happens inside the worker's load
    job_queue_size: int = 1000
    handler: dict = field(default_factory=dict)  # the handler: section (see HandlerConfig)

    def __post_init__(self):
        if self.batching not in ("continuous", "dynamic"):
            raise ValueError(f"batching must be 'continuous' or 'dynamic', got {self.batching!r}")


def model_config(opts: ServingOptions) -> dict:
    cfg = {
        "minWorkers": opts.workers,
        "maxWorkers": opts.workers,
        "batchSize": opts.batch_size,
        "maxBatchDelay": opts.max_batch_delay_ms,
        "responseTimeout": opts.response_timeout_s,
        "startupTimeout": opts.startup_timeout_s,
        "jobQueueSize": opts.job_queue_size,
        "handler": dict(opts.handler),
    }
    if opts.batching == "continuous":
        cfg["continuousBatching"] = True
    # The engine needs a slot for every request TorchServe may send at once.
    cfg["handler"].setdefault("max_batch_size", max(opts.batch_size, 1))
    return cfg
