"""Resumable streams, the one place serving knows them (handler.resume holds the records and the
id scheme), hooked into a request's life at admission and at the cut.

A stream is resumable when this replica has a resume store: its events carry ids (`<key>.<point>`,
a point per sample). So is a gRPC call, answered whole at its end (handler.serving.lifecycle.reply):
its cut reply names an id whose points are 0 (its client holds nothing), and its resume is answered
whole, as a native stream's lines. At a cut its record is written (`record_cut`) before the final event; a
request with `Last-Event-ID`, or the native body's `resume`, becomes the recorded request, each
sample going on from the characters its client holds (`resumed`): a running one in the engine, a
finished one by sending what its client missed of it. A sample with tools rebuilds its parser from
the model's text up to that point, so what the parser held back goes out as it would have.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from handler.engine.sequence import Continuation
from handler.resume.ids import ResumeIdError, ResumePoint, event_id, new_key, parse_event_id, sample_point
from handler.resume.record import RecordedSample, ResumeRecord
from handler.resume.records import ResumeError, ResumeRecords
from handler.serving.live import Incoming, Live, Piece, Sample
from handler.serving.metrics import MetricSink
from handler.serving.protocol import (
    FIELDS,
    GenerationRequest,
    api_for_path,
    check_model,
    decode_body,
)
from handler.serving.request_fields import Limits, RequestError
from handler.serving.tool_calls import ToolStream
from handler.serving.tools import ToolsError, ToolSpec, parse_tools

log = logging.getLogger(__name__)
RESUME_FIELD = "resume"  # the native body's: the id of the last event received
RESUME_MESSAGE = ("this replica is shutting down and its drain time ran out: the generation was cut before it finished; "
                  "resume it on another replica: send the request again with the header `Last-Event-ID: {id}` "
                  "(native API: the body {{\"resume\": \"{id}\"}}), and only what follows is streamed")


@dataclass
class Resumed:
    """A recorded request, as it goes on here."""
    req: GenerationRequest
    samples: list[Sample]  # each as its client holds it
    running: list[Continuation]  # the unfinished samples, for the engine
    pending: list[Piece]  # what finished samples' clients missed: their rest and their end


class Resumption:
    """`records`: where cut streams' records go; None: no stream is resumable here. `decode`: the
    tokenizer's (a record holds token ids)."""

    def __init__(self, records: ResumeRecords | None, limits: Limits, metrics: MetricSink,
                 decode: Callable[[list[int]], str]):
        self.records, self.limits, self.metrics, self.decode = records, limits, metrics, decode

    @staticmethod
    def asked(inc: Incoming) -> ResumePoint | None:
        """The resume point a request asks for (its Last-Event-ID header, or the native body's
        `resume`); None for a new request. RequestError for an id this server never issues."""
        text = inc.last_event_id
        if api_for_path(inc.url_path) == "native" and inc.body is not None:
            data = decode_body(inc.body)
            if RESUME_FIELD in data:
                if not isinstance(data[RESUME_FIELD], str):
                    raise RequestError(f"`{RESUME_FIELD}` must be a string: the `id` of the last event received")
                if text is not None and text.strip() != data[RESUME_FIELD].strip():
                    raise RequestError(f"the Last-Event-ID header and `{RESUME_FIELD}` name different events; send one")
                text = data[RESUME_FIELD]
        if text is None or not text.strip():
            return None
        try:
            return parse_event_id(text)
        except ResumeIdError as err:
            raise RequestError(str(err)) from err

    def resumed(self, point: ResumePoint, inc: Incoming) -> Resumed:
        """The recorded request, and where each sample goes on; RequestError (404, 410, 400, 503)
        else. The body may repeat the first request (only its `model` is read, and checked) or be empty."""
        api = api_for_path(inc.url_path)
        data = decode_body(inc.body) if inc.body not in (None, b"", "") else {}
        unknown = sorted(set(data) - FIELDS[api] - {RESUME_FIELD})
        if unknown:
            raise RequestError(f"unknown field(s) {', '.join(map(repr, unknown))} in a resume request")
        if isinstance(data.get("model"), str):
            check_model(data["model"], self.limits.served_model_name)
        if self.records is None:
            raise RequestError("this replica has no resume store (handler.resume_store): it cannot resume a stream; "
                               "send the request again", status=404)
        try:
            record = self.records.get(point.key, self.limits.vocab_size or 2**31)
        except ResumeError as err:
            raise RequestError(str(err), status=err.status) from err
        _check(record, point, api, self.limits)
        tools = self._tools(record)
        req = GenerationRequest(record.api, list(record.prompt_ids), record.params, True, record.include_usage,
                                len(record.samples), tools)
        out = Resumed(req, [], [], [])
        for index, (recorded, held) in enumerate(zip(record.samples, point.points)):
            out.samples.append(self._sample(index, recorded, held, tools, out))
        return out

    def _tools(self, record: ResumeRecord) -> ToolSpec | None:
        if record.tools is None:
            return None
        try:
            return parse_tools(record.tools, self.limits.tool_format)
        except ToolsError as err:  # sealed, so written by a replica that parsed them: another tool_format
            raise RequestError(f"stream {record.key}'s tools do not parse here ({err}); send the request again",
                               status=404) from err

    def _sample(self, index: int, recorded: RecordedSample, held: int, tools: ToolSpec | None, out: Resumed) -> Sample:
        """Sample `index` as its client holds it (`held`: its point); its continuation or its rest
        goes into `out`."""
        ids = list(recorded.output_ids)
        text = self.decode(ids)
        sample = Sample(tools=ToolStream(tools) if tools else None, token_ids=ids, completion_tokens=len(ids))
        if sample.tools is not None:
            sample.tools.feed(text[:held])  # the parser's state at the client's point; what it let out was sent
        if recorded.finish_reason is None:
            sample.chars = held
            out.running.append(Continuation(recorded.output_ids, held, recorded.rng_state, index))
            return sample
        sample.chars, sample.finish_reason = recorded.sent - 1, recorded.finish_reason
        if held < recorded.sent:  # its client missed the rest of it, or only its end
            rest = text[held:sample.chars]
            if sample.tools is not None:
                rest, sample.tool_calls = sample.tools.last(rest)
            logprobs = () if out.req.params.logprobs is not None else None
            out.pending.append(Piece(index, rest, recorded.finish_reason, False, tuple(sample.tool_calls), logprobs,
                                     recorded.sent))
        return sample

    def key_for(self, req: GenerationRequest, http: bool) -> str | None:
        """A new stream's or gRPC call's key, when this replica can record it. A non-streaming HTTP
        request has none: a balancer sends its cut (a whole 503) again, and it runs anew."""
        return new_key() if self.records is not None and (req.stream or not http) else None

    @staticmethod
    def wants_record(live: Live) -> bool:
        """A request cut now leaves a record: it has a key, its client has been sent pieces (or is
        a gRPC call's, sent nothing until its end), and its samples are where the engine (or its
        record) says."""
        return live.key is not None and (live.opened or not live.http) and (live.started or live.resume is not None)

    def record_cut(self, cut: list[tuple[Live, list[Continuation]]]) -> None:
        """Write each cut stream's record (`wants_record`; its running samples' continuations):
        its resume id, or a plain cut."""
        assert self.records is not None, "only a replica with a resume store gives streams keys"
        for live, running in cut:
            live.resume_id = self._write(live, running)
            self.metrics.observe("ts_llm_request_failure_total", 1, "cut_resumable" if live.resume_id else "cut_by_shutdown")
        try:
            self.records.prune()
        except ResumeError as err:  # expiry is checked on read too: a failed prune costs space, not safety
            log.warning("resume: deleting old records failed: %s", err)

    def _write(self, live: Live, running: list[Continuation]) -> str | None:
        """The id to resume from, or None when the record could not be written (logged: the
        stream ends as an unresumable cut, and its client sends the request again)."""
        assert self.records is not None and live.key is not None, live
        req, at = live.req, {c.index: c for c in running}
        # each sample's point is what its client holds once the final event is out (the pending pieces go with it)
        points = [sample_point(s.chars, s.finish_reason is not None) for s in live.samples]
        samples = tuple(RecordedSample(tuple(s.token_ids), point, None, s.finish_reason) if s.finish_reason is not None
                        else RecordedSample(at[i].output_ids, point, at[i].rng_state)
                        for i, (s, point) in enumerate(zip(live.samples, points)))
        record = ResumeRecord(live.key, self.limits.served_model_name, req.api, time.time(), tuple(req.prompt_ids),
                              samples, req.params, req.include_usage, req.tools.request_fields() if req.tools else None)
        try:
            self.records.put(record)
        except ResumeError as err:
            log.error("resume: stream %s is not resumable: %s", live.key, err)
            return None
        return event_id(live.key, points if live.opened else [0] * len(points))  # a gRPC call's client holds nothing


def _check(record: ResumeRecord, point: ResumePoint, api: str, limits: Limits) -> None:
    if record.model != limits.served_model_name:
        raise RequestError(f"stream {record.key} was generated by model {record.model!r}; this endpoint serves "
                           f"{limits.served_model_name!r}: resume it there", status=404)
    if record.api != api:
        route = next(path for path, name in _ROUTES.items() if name == record.api)
        raise RequestError(f"stream {record.key} streamed on {route!r}; resume it on the same route")
    if len(point.points) != len(record.samples):
        raise RequestError(f"resume id {point} has {len(point.points)} points; stream {record.key} has "
                           f"{len(record.samples)} samples: send the id of the last event received")
    if any(held > s.sent for held, s in zip(point.points, record.samples)):
        sent = ".".join(str(s.sent) for s in record.samples)
        raise RequestError(f"resume id {point} is past what stream {record.key} sent ({sent}); "
                           "send the id of the last event received")
    if len(record.prompt_ids) + record.params.max_new_tokens > limits.max_seq_len:
        raise RequestError(f"stream {record.key} needs a context of {len(record.prompt_ids) + record.params.max_new_tokens} "
                           f"tokens, more than this replica's {limits.max_seq_len}; send the request again")


_ROUTES = {"the native API (/predictions/<model>)": "native", "v1/completions": "completions",
           "v1/chat/completions": "chat"}
