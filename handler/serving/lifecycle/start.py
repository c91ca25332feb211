"""Starting, a request's second stage: admitted requests go into the engine in arrival order while
they fit (slots and KV pages); the engine prefills their prompts at its next step. A request that
does not fit waits, and so does every one behind it."""
from __future__ import annotations

from handler.engine.engine import Engine, EngineFull
from handler.engine.grammar import GrammarError
from handler.serving.formats import error_body
from handler.serving.live import Live, Reply
from handler.serving.metrics import MetricSink


class Starts:
    def __init__(self, engine: Engine, metrics: MetricSink, live: dict[str, Live]):
        self.engine, self.metrics, self.live = engine, metrics, live

    def waiting(self) -> bool:
        return any(self._waits(live) for live in self.live.values())

    def start_waiting(self) -> dict[str, Reply]:
        """Start waiting requests in arrival order while they fit; the replies of those that could
        not start, by request id."""
        refused, blocked = {}, False
        for request_id, live in list(self.live.items()):
            if not self._waits(live):
                continue
            if not blocked and self._fits(live):
                if (refusal := self._start(request_id)) is not None:
                    refused[request_id] = refusal
            else:
                blocked = True
        # Before the step, so admissions and cancellations show at once (the sidecar's drain reads it).
        self.metrics.observe("ts_llm_requests_running", self.engine.running)
        return refused

    @staticmethod
    def _waits(live: Live) -> bool:
        return not live.started and live.finish_reason is None

    def _fits(self, live: Live) -> bool:
        return self.engine.fits(len(live.req.prompt_ids), live.sample_params)

    def _start(self, request_id: str) -> Reply | None:
        """Into the engine; a Reply (and out of the table) when it cannot start: a 503 when its
        slots or KV pages are not free, a 400 when its grammar's matcher cannot start."""
        live = self.live[request_id]
        try:
            self.engine.add_samples(request_id, live.req.prompt_ids, live.sample_params, live.resume)
        except EngineFull as err:
            return self._refuse(request_id, "engine_full", f"{err}; retry", 503)
        except GrammarError as err:  # checked at admission; a matcher can still fail to start
            return self._refuse(request_id, "invalid_request", f"`response_format`: {err}", 400)
        live.started = True
        self.metrics.observe("ts_llm_prompt_tokens_total", len(live.req.prompt_ids))
        return None

    def _refuse(self, request_id: str, reason: str, message: str, status: int) -> Reply:
        del self.live[request_id]
        self.metrics.observe("ts_llm_request_failure_total", 1, reason)
        return Reply(error_body(message, status), status)
