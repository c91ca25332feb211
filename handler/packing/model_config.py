"""The model-config.yaml packed into a .mar: TorchServe's frontend keys plus our `handler:` section."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from handler.serving.config import HandlerConfig
from handler.typed_config import ConfigError, choices


@dataclass(frozen=True)
class ServingOptions:
    # "continuous": TorchServe's continuousBatching; "async": asyncCommunication (the worker's own
    # engine loop); "dynamic": batchSize/maxBatchDelay
    batching: Literal["continuous", "async", "dynamic"] = "continuous"
    batch_size: int = 16  # requests decoded together (continuous, async) or one batch's size (dynamic)
    # What a request that finds the worker idle waits for others to share its first call (under
    # load the frontend adds arrivals without waiting). 1, not 10: a lone request's first token
    # came 10 ms later; arrivals a call apart share decode steps anyway (docs/benchmarks.md). Not 0:
    # measured, a lone request's first token then came ~0.1 s later.
    max_batch_delay_ms: int = 1
    workers: int = 1
    response_timeout_s: int = 600
    startup_timeout_s: int = 900  # compile (cold) happens inside the worker's load
    job_queue_size: int = 1000
    handler: dict = field(default_factory=dict)  # the handler: section (see HandlerConfig)

    def __post_init__(self):
        if self.batching not in choices(ServingOptions, "batching"):
            raise ConfigError(f"batching must be one of {', '.join(choices(ServingOptions, 'batching'))}, "
                              f"got {self.batching!r}")


def model_config(opts: ServingOptions) -> dict:
    cfg: dict[str, Any] = {
        "minWorkers": opts.workers,
        "maxWorkers": opts.workers,
        "batchSize": opts.batch_size,
        "maxBatchDelay": opts.max_batch_delay_ms,
        "responseTimeout": opts.response_timeout_s,
        "startupTimeout": opts.startup_timeout_s,
        "jobQueueSize": opts.job_queue_size,
        "handler": dict(opts.handler),
    }
    # The engine needs a slot for every request TorchServe may send at once.
    cfg["handler"].setdefault("max_batch_size", max(opts.batch_size, 1))
    if opts.batching == "continuous":
        cfg["continuousBatching"] = True
    elif opts.batching == "async":
        # The frontend hands over requests one by one; the engine's slots batch them.
        cfg["asyncCommunication"] = True
        cfg["batchSize"] = 1
    return cfg


def handler_config(opts: ServingOptions, checkpoint_dir: Path) -> HandlerConfig:
    """The config a worker of this archive parses, its engine reading the weights from
    checkpoint_dir (the build's copy). No environment: the cache dir is no part of a key."""
    cfg = HandlerConfig.from_model_yaml(model_config(opts), checkpoint_dir.parent, environ={})
    return dataclasses.replace(cfg, engine=dataclasses.replace(cfg.engine, checkpoint_dir=checkpoint_dir))
