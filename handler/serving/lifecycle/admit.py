"""Admission, a request's first stage: what came in becomes a request waiting to start (a Live in
the table), or is answered now: a models route, a refusal while draining, a bad request (4xx), a
resume that cannot be served. Nothing here touches the engine's slots (handler.serving.lifecycle.start)."""
from __future__ import annotations

import time
from collections.abc import Callable

from handler.engine.engine import Engine
from handler.engine.grammar import GrammarError
from handler.resume.ids import ResumePoint
from handler.serving.formats import error_body, model_body, model_list_body
from handler.serving.lifecycle.resume import Resumption
from handler.serving.live import Incoming, Live, Reply, Sample
from handler.serving.metrics import MetricSink
from handler.serving.protocol import GenerationRequest, check_model, models_route, parse_request
from handler.serving.request_fields import Limits, RequestError
from handler.serving.tool_calls import ToolStream

DRAINING_MESSAGE = "this replica is draining before shutdown; retry on another replica"


class Admission:
    def __init__(self, engine: Engine, limits: Limits, metrics: MetricSink, live: dict[str, Live], resume: Resumption,
                 clock: Callable[[], float], draining: Callable[[], bool], cutting: Callable[[], bool]):
        self.engine, self.limits, self.metrics, self.live = engine, limits, metrics, live
        self.resume, self.clock = resume, clock
        self.draining, self.cutting = draining, cutting  # the drain has begun: new requests go to another replica
        self.started = int(time.time())  # the model list's `created`

    def admit(self, inc: Incoming) -> Reply | None:
        """Into the table, waiting to start; a Reply when the request is refused, or asks nothing of the engine."""
        if (model := models_route(inc.url_path)) is not None:
            return self._models_reply(model)
        if self.draining() or self.cutting():
            # Refused before it was accepted: the client retries on another replica.
            return self._refused("draining", DRAINING_MESSAGE, 503)
        tok = self.engine.tokenizer
        try:
            if (point := self.resume.asked(inc)) is not None:
                return self._admit_resumed(inc, point)
            req = parse_request(inc.body, inc.url_path, tok.encode, tok.encode_chat, self.limits)
            self._check_schema(req.params.json_schema, "`tools`" if req.tools else "`response_format`")
        except RequestError as err:
            return self._refused("invalid_request", err.message, err.status)
        self._add(inc, req, self.resume.key_for(req, inc.http))
        return None

    def _admit_resumed(self, inc: Incoming, point: ResumePoint) -> Reply | None:
        try:
            resumed = self.resume.resumed(point, inc)
        except RequestError as err:
            return self._refused("resume_refused", err.message, err.status)
        req = resumed.req
        every = req.sample_params()
        params = [every[c.index] for c in resumed.running]
        self.live[inc.request_id] = Live(req, params, inc.http, self.clock(), resumed.samples,
                                         pending=resumed.pending, key=point.key, points=list(point.points),
                                         resume=resumed.running)
        return None

    def _refused(self, reason: str, message: str, status: int) -> Reply:
        self.metrics.observe("ts_llm_request_failure_total", 1, reason)
        return Reply(error_body(message, status), status)

    def _add(self, inc: Incoming, req: GenerationRequest, key: str | None) -> None:
        samples = [Sample(tools=ToolStream(req.tools) if req.tools else None) for _ in range(req.n)]
        self.live[inc.request_id] = Live(req, req.sample_params(), inc.http, self.clock(), samples, key=key,
                                         points=[0] * req.n)

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
        """A 400 now for a schema the engine cannot constrain to, not an error at the start."""
        if schema is None:
            return
        if self.engine.grammars is None:
            raise RequestError(f"{field} is not supported by this engine; send the request without it")
        try:
            self.engine.grammars.grammar(schema)
        except GrammarError as err:
            raise RequestError(f"{field}: {err}") from err
        self.metrics.observe("ts_llm_structured_output_requests_total", 1)
