"""Serving metrics, named as vLLM/TGI users expect, emitted through an injected sink.

The TorchServe sink writes them to TorchServe's metric cache, which its frontend exposes on the
Prometheus endpoint; every name here must also be declared in metrics.yaml (a test checks it).
"""
from __future__ import annotations

from dataclasses import dataclass, field
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
    "ts_llm_compile_eager_fallback_total": "Count",
    "ts_llm_compile_artifacts_rejected_total": "Count",  # failed verification or another key: not loaded
}
GAUGES = {
    "ts_llm_requests_running": "Count",
    "ts_llm_batch_occupancy_ratio": "Ratio",  # 0..1, as Prometheus ratios are
    "ts_llm_compile_seconds": "Seconds",
    "ts_llm_engine_info": "Count",  # 1, label path: "<cpu profile>/<dtype>/packed-<packing>"
    "ts_llm_engine_mode": "Count",  # 1 for the mode the steps run in now, 0 for the others (ENGINE_MODES)
}
LABELS = {"ts_llm_request_success_total": "finished_reason", "ts_llm_request_failure_total": "reason",
          "ts_llm_engine_info": "path", "ts_llm_engine_mode": "mode"}
# What the engine's steps run: eager; eager while a verified artifact loads beside them (seconds),
# or while a cold compile runs in a process of its own (minutes); compiled graphs.
ENGINE_MODES = ("eager", "loading", "compiling", "compiled")


class MetricSink(Protocol):
    def observe(self, name: str, value: float, label: str | None = None) -> None: ...


@dataclass
class RecordingSink:
    """Keeps every observation; for tests and the benchmark's own accounting."""
    values: list[tuple[str, float, str | None]] = field(default_factory=list)

    def observe(self, name: str, value: float, label: str | None = None) -> None:
        self.values.append((name, value, label))

    def of(self, name: str) -> list[float]:
        return [v for n, v, _ in self.values if n == name]


def observe_engine_mode(sink: MetricSink, mode: str) -> None:
    """One series per mode, so that a dashboard sees a switch as one series going 0 -> 1."""
    assert mode in ENGINE_MODES, mode
    for m in ENGINE_MODES:
        sink.observe("ts_llm_engine_mode", float(m == mode), m)


class TorchServeSink:
    """Writes to TorchServe's backend metric cache (declared in metrics.yaml)."""

    def __init__(self, context_metrics, model_name: str):
        self._metrics = context_metrics
        self._model = model_name

    def observe(self, name: str, value: float, label: str | None = None) -> None:
        from ts.metrics.metric_type_enum import MetricTypes

        kind = MetricTypes.HISTOGRAM if name in HISTOGRAMS else MetricTypes.GAUGE if name in GAUGES else MetricTypes.COUNTER
        metric = self._metrics.get_metric(name, kind)
        dims = ([label] if name in LABELS else []) + [self._model, "Model"]
        metric.add_or_update(value, dims)
