"""Ending a request before it finishes: its client went away, a server fault failed its batch, or
the drain's wait ran out (the cut: each running request ends now with a retryable error, and a
resumable stream's record is written first, so that its last event can say where to resume)."""
from __future__ import annotations

from handler.engine.engine import Engine
from handler.serving.lifecycle.resume import Resumption
from handler.serving.live import Live
from handler.serving.metrics import MetricSink


class Ending:
    def __init__(self, engine: Engine, metrics: MetricSink, live: dict[str, Live], resume: Resumption):
        self.engine, self.metrics, self.live, self.resume = engine, metrics, live, resume

    def cancel(self, gone: list[str]) -> None:
        """Cancel requests whose clients went away or timed out."""
        for request_id in gone:
            self.drop(request_id)
            self.metrics.observe("ts_llm_request_failure_total", 1, "cancelled")

    def fail(self, request_id: str) -> Live:
        """A server fault ended it (the engine thread's error boundary): out, counted."""
        live = self.drop(request_id)
        assert live is not None, request_id
        self.metrics.observe("ts_llm_request_failure_total", 1, "server_error")
        return live

    def drop(self, request_id: str) -> Live | None:
        """Out of the engine and out of the table (a server fault's batch, a gone client)."""
        self.engine.cancel(request_id)
        return self.live.pop(request_id, None)

    def cut_running(self) -> None:
        """End every unfinished request, waiting ones too: its last reply is a cut's (a 503, or a
        final error event on a stream already sent), not a connection reset when TorchServe stops."""
        cut = []
        for request_id, live in self.live.items():
            if live.finish_reason is None:
                record = self.resume.wants_record(live)
                if record:  # a resumed stream not yet started goes on where its own record said
                    cut.append((live, self.engine.continuations(request_id) if live.started else list(live.resume or [])))
                self.engine.cancel(request_id)
                live.finish_reason = "cut"
                if not record:
                    self.metrics.observe("ts_llm_request_failure_total", 1, "cut_by_shutdown")
        if cut:
            self.resume.record_cut(cut)
        self.metrics.observe("ts_llm_requests_running", self.engine.running)
