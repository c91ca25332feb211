"""Request lifecycle over the engine, with no TorchServe in it: what every batching mode shares
(BaseService). batchSize/maxBatchDelay mode is dynamic_service.DynamicService, continuousBatching
continuous_service.ContinuousService, asyncCommunication loop_service.LoopService.

Transport rules come from TorchServe 0.12.0's frontend:
- HTTP: a reply marked `more=True` opens a chunked response; `more=False` ends it; `more=None` is
  a whole response (the only form that may carry a 4xx, and the only form allowed for a request
  answered in its first call).
- gRPC (no HTTP headers): in continuous mode the frontend completes a unary call on its first
  reply and drops a stream after its first reply, so gRPC requests are finished inside the call
  that admits them (one reply, `more=False`). Token-by-token gRPC streaming needs dynamic mode.
  In every mode a gRPC call's last reply is `more=False` (`last_reply`): StreamPredictions ends on
  nothing else, and a stream's only reply without it makes the frontend fail the worker.
"""
from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from handler.engine.engine import Engine, EngineFull
from handler.engine.grammar import GrammarError
from handler.engine.sampling import TokenLogprob
from handler.engine.sequence import Continuation, StepOutput
from handler.resume.ids import ResumePoint, event_id, new_key, public_id
from handler.resume.records import ResumeRecords
from handler.serving import resumption
from handler.serving.formats import Choice, Formatter, error_body, model_body, model_list_body
from handler.serving.live import Incoming, Live, Reply, Sample, SendPartial
from handler.serving.metrics import MetricSink
from handler.serving.protocol import GenerationRequest, check_model, models_route, parse_request
from handler.serving.request_fields import Limits, RequestError
from handler.serving.tool_calls import ToolStream

CUT_MESSAGE = ("this replica is shutting down and its drain time ran out: the generation was cut before it "
               "finished; retry on another replica")


class BaseService:
    def __init__(self, engine: Engine, limits: Limits, metrics: MetricSink, clock: Callable[[], float] = time.monotonic,
                 draining: Callable[[], bool] = lambda: False, cutting: Callable[[], bool] = lambda: False,
                 records: ResumeRecords | None = None):
        self.engine, self.limits, self.metrics, self.clock = engine, limits, metrics, clock
        self.records = records  # where cut streams' records go (handler.resume); None: no stream is resumable
        # draining: refuse new requests (503), finish running ones. cutting: the drain's wait is
        # over, TorchServe stops next: end running ones now, each with a retryable error.
        self.draining, self.cutting = draining, cutting
        self.live: dict[str, Live] = {}
        self.started = int(time.time())  # the model list's `created`

    def start(self) -> None:
        """Called once, on the thread that built the engine (LoopService starts its engine thread)."""

    def handle(self, batch: list[Incoming], send_partial: SendPartial) -> list[Reply] | Awaitable[list[Reply]]:
        """One TorchServe call's requests: their replies, by batch index (an awaitable of them in
        asyncCommunication mode); streamed pieces go through `send_partial` where the mode sends
        them between replies."""
        raise NotImplementedError

    def abandon(self, request_ids: list[str]) -> None:
        """Forget these requests (the handler's error boundary failed their batch): out of the engine
        and out of `live`."""
        for request_id in request_ids:
            self.engine.cancel(request_id)
            self.live.pop(request_id, None)

    def cut_running(self) -> None:
        """End every unfinished request: its reply becomes cut_reply's (a 503, or a final error
        event on a stream already sent), not a connection reset when TorchServe stops. A
        resumable stream's record is written first, so that its final event can say where to resume."""
        cut = []
        for request_id, live in self.live.items():
            if live.finish_reason is None:
                at = self.engine.continuation(request_id) if live.key and live.opened else None
                self.engine.cancel(request_id)
                live.finish_reason = "cut"
                if at is not None:
                    cut.append((live, at))
                else:
                    self.metrics.observe("ts_llm_request_failure_total", 1, "cut_by_shutdown")
        if cut:
            self._write_records(cut)

    def _write_records(self, cut: list[tuple[Live, Continuation]]) -> None:
        assert self.records is not None, "only a replica with a resume store gives streams keys"
        for live, at in cut:
            assert live.key is not None, live
            # What the client holds once the final event is out (the pending pieces go with it).
            live.resume_id = resumption.write_record(self.records, live.key, live.req, at, live.samples[0].chars,
                                                     self.limits.served_model_name)
            self.metrics.observe("ts_llm_request_failure_total", 1, "cut_resumable" if live.resume_id else "cut_by_shutdown")
        resumption.prune(self.records)

    def cut_reply(self, live: Live) -> Reply:
        if not live.opened:
            return Reply(error_body(CUT_MESSAGE, 503), 503, more=None if live.http else False)
        ctype = live.fmt.content_type(live.req.stream)
        if not live.req.stream:  # a whole answer riding a chunked response: its body is the error
            return Reply(error_body(CUT_MESSAGE, 503), content_type=ctype, more=False)
        end = (live.fmt.error_event(CUT_MESSAGE, 503) if live.resume_id is None
               else live.fmt.resume_event(resumption.RESUME_MESSAGE.format(id=live.resume_id), live.resume_id))
        return Reply("".join(live.pending) + end, content_type=ctype, more=False)

    def last_reply(self, live: Live) -> Reply:
        """A finished request's last reply. more=False ends a chunked HTTP response and any gRPC
        call: TorchServe completes StreamPredictions on nothing else, and its frontend fails the
        worker on a stream's reply that says neither; None is a whole HTTP response."""
        if live.cut:
            return self.cut_reply(live)
        return Reply(self._whole(live), content_type=live.fmt.content_type(live.req.stream),
                     more=False if live.opened or not live.http else None)

    def _accept(self, inc: Incoming) -> Reply | None:
        """Parse into self.live, not yet started; a Reply when the request is refused, or asks nothing of the engine."""
        if (model := models_route(inc.url_path)) is not None:
            return self._models_reply(model)
        if self.draining() or self.cutting():
            # Refused before it was accepted: the client retries on another replica.
            self.metrics.observe("ts_llm_request_failure_total", 1, "draining")
            return Reply(error_body("this replica is draining before shutdown; retry on another replica", 503), 503)
        tok = self.engine.tokenizer
        try:
            if (point := resumption.asked_resume(inc.body, inc.url_path, inc.last_event_id)) is not None:
                return self._accept_resume(inc, point)
            req = parse_request(inc.body, inc.url_path, tok.encode, tok.encode_chat, self.limits)
            self._check_schema(req.params.json_schema, "`tools`" if req.tools else "`response_format`")
        except RequestError as err:
            self.metrics.observe("ts_llm_request_failure_total", 1, "invalid_request")
            return Reply(error_body(err.message, err.status), err.status)
        key = new_key() if self.records is not None and resumption.resumable(req) else None
        self._add_live(inc, req, key)
        return None

    def _accept_resume(self, inc: Incoming, point: ResumePoint) -> Reply | None:
        try:
            req, at = resumption.resume_request(self.records, point, inc.body, inc.url_path, self.limits)
        except RequestError as err:
            self.metrics.observe("ts_llm_request_failure_total", 1, "resume_refused")
            return Reply(error_body(err.message, err.status), err.status)
        self._add_live(inc, req, point.key, at)
        return None

    def _add_live(self, inc: Incoming, req: GenerationRequest, key: str | None, resume: Continuation | None = None) -> None:
        tok = self.engine.tokenizer
        fmt = Formatter(req.api, self.limits.served_model_name, req.include_usage, token_text=lambda i: tok.decode([i]))
        if key is not None:  # the same id on every replica, and not the key: whoever logs ids cannot resume
            fmt.id = public_id(key)
        samples = [Sample(tools=ToolStream(req.tools) if req.tools else None) for _ in range(req.n)]
        if resume is not None:  # its client holds the text up to its resume point
            fmt.resumed(resume.sent_chars)
            samples[0].chars = resume.sent_chars
        self.live[inc.request_id] = Live(req, fmt, inc.http, self.clock(), samples, key=key, resume=resume)

    def _models_reply(self, model: str) -> Reply:
        served = self.limits.served_model_name
        if not model:
            return Reply(model_list_body(served, self.started))
        try:
            check_model(model, served)
        except RequestError as err:
            return Reply(error_body(err.message, err.status), err.status)
        return Reply(model_body(served, self.started))

    def _check_schema(self, schema: str | None, field: str) -> None:
        """A 400 now for a schema the engine cannot constrain to, not an error at admission."""
        if schema is None:
            return
        if self.engine.grammars is None:
            raise RequestError(f"{field} is not supported by this engine; send the request without it")
        try:
            self.engine.grammars.grammar(schema)
        except GrammarError as err:
            raise RequestError(f"{field}: {err}") from err
        self.metrics.observe("ts_llm_structured_output_requests_total", 1)

    def _fits(self, request_id: str) -> bool:
        """Whether the engine has the slots and KV pages to start this accepted request now."""
        req = self.live[request_id].req
        return self.engine.fits(len(req.prompt_ids), req.sample_params())

    def _start(self, request_id: str) -> Reply | None:
        """Into the engine; a Reply (and out of self.live) when it cannot start: a 503 when its
        slots or KV pages are not free (only a request that cannot wait is started unchecked),
        a 400 when its grammar's matcher cannot start."""
        live = self.live[request_id]
        try:
            self.engine.add_samples(request_id, live.req.prompt_ids, live.req.sample_params(), live.resume)
        except EngineFull as err:  # a gRPC request cannot wait (continuous_service)
            return self._refuse_start(request_id, "engine_full", f"{err}; retry", 503)
        except GrammarError as err:  # checked at _accept; a matcher can still fail to start
            return self._refuse_start(request_id, "invalid_request", f"`response_format`: {err}", 400)
        live.started = True
        self.metrics.observe("ts_llm_prompt_tokens_total", len(live.req.prompt_ids))
        return None

    def _refuse_start(self, request_id: str, reason: str, message: str, status: int) -> Reply:
        del self.live[request_id]
        self.metrics.observe("ts_llm_request_failure_total", 1, reason)
        return Reply(error_body(message, status), status)

    def _step(self) -> list[StepOutput]:
        outputs = self.engine.step()
        now = self.clock()
        for out in outputs:
            self._record(self.live[out.request_id], out, now)
        # One observation per step, not per token (the TorchServe sink thins them further).
        self.metrics.observe("ts_llm_generation_tokens_total", sum(len(o.token_ids) for o in outputs))
        self.metrics.observe("ts_llm_requests_running", self.engine.running)
        self.metrics.observe("ts_llm_batch_occupancy_ratio", len(outputs) / self.engine.slots)
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
        text = self._content(sample, out)
        sample.text.append(text)
        sample.chars += len(text)
        sample.completion_tokens = out.completion_tokens
        sample.logprobs.extend(out.logprobs)
        if out.finished:
            sample.finish_reason = "tool_calls" if sample.tool_calls and out.finish_reason == "stop" else out.finish_reason
            if all(s.finish_reason is not None for s in live.samples):
                live.finish_reason = live.samples[0].finish_reason
                self._finished_metrics(live, now)
        if live.req.stream and (text or out.finished):
            live.pending.append(live.fmt.chunk(text, sample.finish_reason, live.usage, logprobs=self._unsent_logprobs(live, sample),
                                               index=out.index, last=live.finish_reason is not None,
                                               tool_calls=sample.tool_calls,
                                               event_id=event_id(live.key, sample.chars) if live.key else None))

    @staticmethod
    def _content(sample: Sample, out: StepOutput) -> str:
        """The text of this output that is the answer's content (not a tool call); a finished
        sample's tool calls go to sample.tool_calls."""
        if sample.tools is None:
            return out.text
        text = sample.tools.feed(out.text)
        if out.finished:
            rest, sample.tool_calls = sample.tools.finish()
            text += rest
        return text

    def _finished_metrics(self, live: Live, now: float) -> None:
        self.metrics.observe("ts_llm_e2e_request_latency_seconds", now - live.arrived)
        self.metrics.observe("ts_llm_request_success_total", 1, live.finish_reason)
        generated = live.samples[0].completion_tokens  # per sample: the samples are generated side by side
        if generated > 1 and live.first_token_at is not None:
            self.metrics.observe("ts_llm_time_per_output_token_seconds", (now - live.first_token_at) / (generated - 1))

    @staticmethod
    def _unsent_logprobs(live: Live, sample: Sample) -> list[TokenLogprob] | None:
        if live.req.params.logprobs is None:
            return None
        unsent, sample.logprobs_sent = sample.logprobs[sample.logprobs_sent:], len(sample.logprobs)
        return unsent

    def _whole(self, live: Live) -> str:
        if live.req.stream:
            return "".join(live.pending)
        asked = live.req.params.logprobs is not None
        choices = [Choice("".join(s.text), s.finish_reason, s.logprobs if asked else None, s.tool_calls) for s in live.samples]
        return live.fmt.whole(choices, live.usage)
