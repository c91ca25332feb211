"""Resumable streams, the one place serving knows them (handler.resume holds the records and the
id scheme), hooked into a request's life at admission and at the cut.

A stream is resumable when this replica has a resume store and the stream is one sample with no
tools (a tool call's held-back text is not a point a client can resume from): its events carry
ids (`<key>.<chars>`). At a cut its record is written (`record_cut`) before the final event; a
request with `Last-Event-ID`, or the native body's `resume`, becomes the recorded request, going
on from the characters the client holds (`resumed`).
"""
from __future__ import annotations

import logging
import time

from handler.engine.sequence import Continuation
from handler.resume.ids import ResumeIdError, ResumePoint, event_id, new_key, parse_event_id
from handler.resume.record import ResumeRecord
from handler.resume.records import ResumeError, ResumeRecords
from handler.serving.live import Incoming, Live
from handler.serving.metrics import MetricSink
from handler.serving.protocol import (
    FIELDS,
    GenerationRequest,
    api_for_path,
    check_model,
    decode_body,
)
from handler.serving.request_fields import Limits, RequestError

log = logging.getLogger(__name__)
RESUME_FIELD = "resume"  # the native body's: the id of the last event received
RESUME_MESSAGE = ("this replica is shutting down and its drain time ran out: the generation was cut before it finished; "
                  "resume it on another replica: send the request again with the header `Last-Event-ID: {id}` "
                  "(native API: the body {{\"resume\": \"{id}\"}}), and only what follows is streamed")


class Resumption:
    """`records`: where cut streams' records go; None: no stream is resumable here."""

    def __init__(self, records: ResumeRecords | None, limits: Limits, metrics: MetricSink):
        self.records, self.limits, self.metrics = records, limits, metrics

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

    def resumed(self, point: ResumePoint, inc: Incoming) -> tuple[GenerationRequest, Continuation]:
        """The recorded request, and where it goes on; RequestError (404, 410, 400, 503) else. The
        body may repeat the first request (only its `model` is read, and checked) or be empty."""
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
        req = GenerationRequest(record.api, list(record.prompt_ids), record.params, True, record.include_usage)
        return req, Continuation(record.output_ids, point.chars, record.rng_state)

    def key_for(self, req: GenerationRequest) -> str | None:
        """A new stream's key, when it is resumable here: one sample, no tools (a tool call's
        held-back text is not a point a client can resume from)."""
        resumable = req.stream and req.n == 1 and req.tools is None
        return new_key() if self.records is not None and resumable else None

    @staticmethod
    def wants_record(live: Live) -> bool:
        """A stream cut now leaves a record: it has a key and its client has been sent pieces."""
        return live.key is not None and live.opened

    def record_cut(self, cut: list[tuple[Live, Continuation]]) -> None:
        """Write each cut stream's record (`wants_record`): its resume id, or a plain cut."""
        assert self.records is not None, "only a replica with a resume store gives streams keys"
        for live, at in cut:
            live.resume_id = self._write(live, at)
            self.metrics.observe("ts_llm_request_failure_total", 1, "cut_resumable" if live.resume_id else "cut_by_shutdown")
        try:
            self.records.prune()
        except ResumeError as err:  # expiry is checked on read too: a failed prune costs space, not safety
            log.warning("resume: deleting old records failed: %s", err)

    def _write(self, live: Live, at: Continuation) -> str | None:
        """The id to resume from, or None when the record could not be written (logged: the
        stream ends as an unresumable cut, and its client sends the request again)."""
        assert self.records is not None and live.key is not None, live
        req = live.req
        sent_chars = live.samples[0].chars  # what the client holds once the final event is out (the pending pieces go with it)
        record = ResumeRecord(live.key, self.limits.served_model_name, req.api, time.time(), tuple(req.prompt_ids),
                              at.output_ids, sent_chars, req.params, req.include_usage, at.rng_state)
        try:
            self.records.put(record)
        except ResumeError as err:
            log.error("resume: stream %s is not resumable: %s", live.key, err)
            return None
        return event_id(live.key, sent_chars)


def _check(record: ResumeRecord, point: ResumePoint, api: str, limits: Limits) -> None:
    if record.model != limits.served_model_name:
        raise RequestError(f"stream {record.key} was generated by model {record.model!r}; this endpoint serves "
                           f"{limits.served_model_name!r}: resume it there", status=404)
    if record.api != api:
        route = next(path for path, name in _ROUTES.items() if name == record.api)
        raise RequestError(f"stream {record.key} streamed on {route!r}; resume it on the same route")
    if point.chars > record.sent_chars:
        raise RequestError(f"resume id {point} is past the {record.sent_chars} characters stream {record.key} sent; "
                           "send the id of the last event received")
    if len(record.prompt_ids) + record.params.max_new_tokens > limits.max_seq_len:
        raise RequestError(f"stream {record.key} needs a context of {len(record.prompt_ids) + record.params.max_new_tokens} "
                           f"tokens, more than this replica's {limits.max_seq_len}; send the request again")


_ROUTES = {"the native API (/predictions/<model>)": "native", "v1/completions": "completions",
           "v1/chat/completions": "chat"}
