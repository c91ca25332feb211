"""Stepping, a request's third stage: one engine step for every running request, its outputs
recorded into each (text, tool calls held back, log-probabilities, finish) as pieces for the
reply stage, and the step's metrics."""
from __future__ import annotations

from collections.abc import Callable

from handler.engine.engine import Engine
from handler.engine.sampling import TokenLogprob
from handler.engine.sequence import StepOutput
from handler.resume.ids import sample_point
from handler.serving.live import Live, Piece, Sample
from handler.serving.metrics import MetricSink


def never_alone() -> int:
    """Steps' `times_alone` where no kernel pool runs them (a test's engine)."""
    return 0


class Steps:
    def __init__(self, engine: Engine, metrics: MetricSink, live: dict[str, Live], clock: Callable[[], float],
                 times_alone: Callable[[], int]):
        self.engine, self.metrics, self.live, self.clock = engine, metrics, live, clock
        self.times_alone = times_alone  # handler.engine.kernels.build.times_alone, or a test's
        self._alone_seen = times_alone()

    def step(self) -> list[StepOutput]:
        outputs = self.engine.step()
        now = self.clock()
        for out in outputs:
            self._record(self.live[out.request_id], out, now)
        # One observation per step, not per token (the TorchServe sink thins them further).
        self.metrics.observe("ts_llm_generation_tokens_total", sum(len(o.token_ids) for o in outputs))
        self.metrics.observe("ts_llm_requests_running", self.engine.running)
        self.metrics.observe("ts_llm_batch_occupancy_ratio", len(outputs) / self.engine.slots)
        alone = self.times_alone()
        self.metrics.observe("ts_llm_engine_threads_alone_total", alone - self._alone_seen)
        self._alone_seen = alone
        if not self.engine.running:
            self.metrics.flush()
        return outputs

    def _record(self, live: Live, out: StepOutput, now: float) -> None:
        if live.first_token_at is None:
            live.first_token_at = now
            self.metrics.observe("ts_llm_time_to_first_token_seconds", now - live.arrived)
            live.cached_tokens = out.cached_tokens
            self.metrics.observe("ts_llm_prefix_cache_hit_tokens_total", out.cached_tokens)
        sample = live.samples[out.index]
        text = _content(sample, out)
        sample.text.append(text)
        sample.chars += len(out.text)
        sample.token_ids.extend(out.token_ids)
        sample.completion_tokens = out.completion_tokens
        sample.logprobs.extend(out.logprobs)
        if out.finished:
            sample.finish_reason = "tool_calls" if sample.tool_calls and out.finish_reason == "stop" else out.finish_reason
            if all(s.finish_reason is not None for s in live.samples):
                live.finish_reason = live.samples[0].finish_reason
                self._finished_metrics(live, now)
        if live.req.stream and (text or out.finished):
            live.pending.append(Piece(out.index, text, sample.finish_reason, live.finish_reason is not None,
                                      tuple(sample.tool_calls), _unsent_logprobs(live, sample),
                                      sample_point(sample.chars, sample.finish_reason is not None)))

    def _finished_metrics(self, live: Live, now: float) -> None:
        self.metrics.observe("ts_llm_e2e_request_latency_seconds", now - live.arrived)
        self.metrics.observe("ts_llm_request_success_total", 1, live.finish_reason)
        generated = live.samples[0].completion_tokens  # per sample: the samples are generated side by side
        if generated > 1 and live.first_token_at is not None:
            self.metrics.observe("ts_llm_time_per_output_token_seconds", (now - live.first_token_at) / (generated - 1))


def _content(sample: Sample, out: StepOutput) -> str:
    """The text of this output that is the answer's content (not a tool call); a finished
    sample's tool calls go to sample.tool_calls."""
    if sample.tools is None:
        return out.text
    if not out.finished:
        return sample.tools.feed(out.text)
    text, sample.tool_calls = sample.tools.last(out.text)
    return text


def _unsent_logprobs(live: Live, sample: Sample) -> tuple[TokenLogprob, ...] | None:
    if live.req.params.logprobs is None:
        return None
    unsent, sample.logprobs_sent = sample.logprobs[sample.logprobs_sent:], len(sample.logprobs)
    return tuple(unsent)
