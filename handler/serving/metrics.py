"""Serving metrics, named as vLLM/TGI users expect, emitted through an injected sink.

The TorchServe sink writes them to TorchServe's metric cache, which its frontend exposes on the
Prometheus endpoint; every name here must also be declared in metrics.yaml (a test checks it).
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Protocol

HISTOGRAMS = {
    "ts_llm_time_to_first_token_seconds": "Seconds",
    "ts_llm_time_per_output_token_seconds": "Seconds",
    "ts_llm_e2e_request_latency_seconds": "Seconds",
}
COUNTERS = {
    "ts_llm_prompt_tokens_total": "Count",
    "ts_llm_generation_tokens_total": "Count",
    "ts_llm_request_success_total": "Count",  # label finished_reason
    "ts_llm_request_failure_total": "Count",  # label reason
    "ts_llm_structured_output_requests_total": "Count",  # accepted requests with a response_format schema
    # prompt tokens whose KV came from the prefix cache; over ts_llm_prompt_tokens_total: the hit rate
    "ts_llm_prefix_cache_hit_tokens_total": "Count",
    "ts_llm_compile_eager_fallback_total": "Count",
    "ts_llm_compile_artifacts_rejected_total": "Count",  # failed verification or another key: not loaded
    # times the products went on alone because a core was taken (handler.engine.kernels.build.times_alone)
    "ts_llm_engine_threads_alone_total": "Count",
}
GAUGES = {
    "ts_llm_requests_running": "Count",
    "ts_llm_batch_occupancy_ratio": "Ratio",  # 0..1, as Prometheus ratios are
    "ts_llm_compile_seconds": "Seconds",
    "ts_llm_engine_info": "Count",  # 1, label path: "<cpu profile>/<dtype>/packed-<packing>"
    "ts_llm_engine_mode": "Count",  # 1 for the mode the steps run in now, 0 for the others (ENGINE_MODES)
    "ts_llm_engine_threads": "Count",  # threads a step runs on, label wait: "spin 3000" (handler/engine/kernels/threads.py)
}
LABELS = {"ts_llm_request_success_total": "finished_reason", "ts_llm_request_failure_total": "reason",
          "ts_llm_engine_info": "path", "ts_llm_engine_mode": "mode", "ts_llm_engine_threads": "wait"}
# What the engine's steps run: eager; eager while a verified artifact loads beside them (seconds),
# or while a cold compile runs in a process of its own (minutes); compiled graphs.
ENGINE_MODES = ("eager", "loading", "compiling", "compiled")


class MetricSink(Protocol):
    def observe(self, name: str, value: float, label: str | None = None) -> None: ...

    def flush(self) -> None:
        """Write what the sink holds back (the service calls it when its engine goes idle)."""


def observe_engine_mode(sink: MetricSink, mode: str) -> None:
    """One series per mode, so that a dashboard sees a switch as one series going 0 -> 1."""
    assert mode in ENGINE_MODES, mode
    for m in ENGINE_MODES:
        sink.observe("ts_llm_engine_mode", float(m == mode), m)


class EngineModeGauge:
    """ts_llm_engine_mode over a worker's start: the mode the steps start in, then the one a
    background load settles on (from its own thread, as it ends). A load that ends before the
    start is reported must not be overwritten by the start's "loading"."""

    def __init__(self, sink: MetricSink):
        self._sink = sink
        self._lock = threading.Lock()
        self._settled = False

    def started(self, mode: str) -> None:
        with self._lock:
            if not self._settled:
                observe_engine_mode(self._sink, mode)

    def settled(self, mode: str) -> None:
        with self._lock:
            self._settled = True
            observe_engine_mode(self._sink, mode)


STEP_COUNTERS = {"ts_llm_generation_tokens_total", "ts_llm_engine_threads_alone_total"}  # observed every decode step
COUNTER_WRITE_S = 1.0  # their sums are written at most this often (and at flush)


class TorchServeSink:
    """Writes to TorchServe's backend metric cache (declared in metrics.yaml).

    Each write is a log line the worker prints and the frontend parses, three or four per decode
    step before this (3% of a one-client worker's time, measured with py-spy), so per-step series
    are thinned without changing what Prometheus reads: a gauge is written when its value
    changes, STEP_COUNTERS are summed and written at most every COUNTER_WRITE_S and at flush()
    (the service flushes when its engine goes idle); other counters and histograms as observed.
    Thread-safe: a background load reports the engine mode from its own thread as it ends."""

    def __init__(self, context_metrics, model_name: str, clock: Callable[[], float] = time.monotonic):
        self._metrics = context_metrics
        self._model = model_name
        self._clock = clock
        self._gauges: dict[tuple[str, str | None], float] = {}
        self._counts: dict[tuple[str, str | None], float] = {}
        self._written_at = clock()
        self._lock = threading.Lock()

    def observe(self, name: str, value: float, label: str | None = None) -> None:
        with self._lock:
            self._observe(name, value, label)

    def flush(self) -> None:
        with self._lock:
            self._flush()

    def _observe(self, name: str, value: float, label: str | None) -> None:
        key = (name, label)
        if name in GAUGES:
            if self._gauges.get(key) != value:
                self._gauges[key] = value
                self._write(name, value, label)
        elif name in STEP_COUNTERS:
            self._counts[key] = self._counts.get(key, 0) + value
            if self._clock() - self._written_at >= COUNTER_WRITE_S:
                self._flush()
        else:
            self._write(name, value, label)

    def _flush(self) -> None:
        for (name, label), value in self._counts.items():
            self._write(name, value, label)
        self._counts.clear()
        self._written_at = self._clock()

    def _write(self, name: str, value: float, label: str | None) -> None:
        from ts.metrics.metric_type_enum import MetricTypes

        kind = MetricTypes.HISTOGRAM if name in HISTOGRAMS else MetricTypes.GAUGE if name in GAUGES else MetricTypes.COUNTER
        metric = self._metrics.get_metric(name, kind)
        dims = ([label] if name in LABELS else []) + [self._model, "Model"]
        metric.add_or_update(value, dims)
