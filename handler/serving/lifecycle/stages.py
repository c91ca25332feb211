"""One replica's requests (request id -> Live, in arrival order) and the stages they live through
(handler.serving.lifecycle), shared by whichever batching mode drives them."""
from __future__ import annotations

import time
from collections.abc import Callable

from handler.engine.engine import Engine
from handler.resume.records import ResumeRecords
from handler.serving.lifecycle.admit import Admission
from handler.serving.lifecycle.end import Ending
from handler.serving.lifecycle.reply import Replies
from handler.serving.lifecycle.resume import Resumption
from handler.serving.lifecycle.start import Starts
from handler.serving.lifecycle.step import Steps, never_alone
from handler.serving.live import Live
from handler.serving.metrics import MetricSink
from handler.serving.request_fields import Limits


class Stages:
    """`draining`: refuse new requests (503), finish running ones. `cutting`: the drain's wait is
    over, TorchServe stops next: end running ones now (Ending.cut_running). `records`: where cut
    streams' records go (handler.resume); None: no stream is resumable. `times_alone`: the engine
    threads' count of times a core was taken (handler.engine.kernels.build.times_alone)."""

    def __init__(self, engine: Engine, limits: Limits, metrics: MetricSink, clock: Callable[[], float] = time.monotonic,
                 draining: Callable[[], bool] = lambda: False, cutting: Callable[[], bool] = lambda: False,
                 records: ResumeRecords | None = None, times_alone: Callable[[], int] = never_alone):
        self.engine, self.clock, self.cutting = engine, clock, cutting
        self.live: dict[str, Live] = {}
        resume = Resumption(records, limits, metrics, engine.tokenizer.decode)
        self.admission = Admission(engine, limits, metrics, self.live, resume, clock, draining, cutting)
        self.starts = Starts(engine, metrics, self.live)
        self.steps = Steps(engine, metrics, self.live, clock, times_alone)
        self.replies = Replies(self.live, limits.served_model_name, engine.tokenizer.token_text, clock)
        self.ending = Ending(engine, metrics, self.live, resume)
