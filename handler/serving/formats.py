"""Response bodies for the native API and the OpenAI-style routes (whole and streamed)."""
from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import accumulate

from handler.engine.sampling import TokenLogprob
from handler.serving.tool_calls import ToolCall

RETRY_MS = 1000  # SSE `retry:` of a cut stream's final event: how soon an EventSource reconnects
SSE_KEEPALIVE = ": keep-alive\n\n"  # an SSE comment: clients skip it; proxies see bytes


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int  # all choices' together
    cached_tokens: int = 0  # prompt tokens whose KV came from the prefix cache

    def body(self) -> dict:
        """OpenAI's usage object (the native API's too)."""
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens,
                "prompt_tokens_details": {"cached_tokens": self.cached_tokens}}


def error_body(message: str, status: int) -> str:
    return json.dumps(error_object(message, status))


def error_object(message: str, status: int) -> dict:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return {"error": {"message": message, "type": kind, "code": status}}


def model_list_body(model: str, created: int) -> str:
    """OpenAI's `GET /v1/models`: the one model this endpoint serves."""
    return json.dumps({"object": "list", "data": [_model(model, created)]})


def model_body(model: str, created: int) -> str:
    """OpenAI's `GET /v1/models/{id}`."""
    return json.dumps(_model(model, created))


def _model(model: str, created: int) -> dict:
    return {"id": model, "object": "model", "created": created, "owned_by": "ts-llm"}


@dataclass(frozen=True)
class Choice:
    """One completion of a whole answer; logprobs: its tokens', when the request asked for them."""
    text: str
    finish_reason: str | None  # a Sample's (None, JSON null, until it finishes; a whole answer's have)
    logprobs: Sequence[TokenLogprob] | None = None
    tool_calls: Sequence[ToolCall] = ()


@dataclass
class Formatter:
    api: str  # "native", "completions" or "chat"
    model: str
    include_usage: bool = False
    token_text: Callable[[int], str] = str  # a token id's text, for log-probabilities
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: int = field(default_factory=lambda: int(time.time()))
    _sent_role: set[int] = field(default_factory=set)  # the choices whose first chat delta (with the role) is out
    _text_offset: dict[int, int] = field(default_factory=dict)  # per choice: completions' text_offset of its next token

    def content_type(self, stream: bool) -> str:
        if not stream:
            return "application/json"
        return "application/x-ndjson" if self.api == "native" else "text/event-stream"

    def whole(self, choices: list[Choice], usage: Usage) -> str:
        u = usage.body()
        if self.api == "native":
            [c] = choices
            return json.dumps({"id": self.id, "text": c.text, "finish_reason": c.finish_reason, "usage": u})
        if self.api == "completions":
            out = [{"index": i, "text": c.text, "finish_reason": c.finish_reason, "logprobs": self._logprobs(c.logprobs, i)}
                   for i, c in enumerate(choices)]
            return json.dumps(self._envelope("text_completion", out) | {"usage": u})
        out = [{"index": i, "message": _message(c), "finish_reason": c.finish_reason,
                "logprobs": self._logprobs(c.logprobs)} for i, c in enumerate(choices)]
        return json.dumps(self._envelope("chat.completion", out) | {"usage": u})

    def chunk(self, delta: str, finish_reason: str | None, usage: Usage,
              logprobs: Sequence[TokenLogprob] | None = None, index: int = 0, last: bool | None = None,
              tool_calls: Sequence[ToolCall] = (), event_id: str | None = None) -> str:
        """One streamed piece of choice `index`: NDJSON line (native) or server-sent events
        (OpenAI); logprobs: the tokens' since the previous piece, when the request asked for them.
        last: the request's final piece (default: this choice finished), which ends the stream.
        tool_calls: the choice's calls, each whole in this piece (chat). event_id: a resumable
        stream's resume point after this piece (SSE `id:` on each event, NDJSON `"resume"`)."""
        last = finish_reason is not None if last is None else last
        if self.api == "native":
            piece: dict[str, object] = {"text": delta, "finish_reason": finish_reason}
            if finish_reason is not None:
                piece["usage"] = usage.body()
            if event_id is not None:
                piece["resume"] = event_id
            return json.dumps(piece) + "\n"
        if self.api == "completions":
            choice = {"index": index, "text": delta, "finish_reason": finish_reason,
                      "logprobs": self._logprobs(logprobs, index)}
            events: list[dict | str] = [self._envelope("text_completion", [choice])]
        else:
            d: dict = {"content": delta}
            if tool_calls:
                d = {"content": delta or None, "tool_calls": [{"index": k} | c.body() for k, c in enumerate(tool_calls)]}
            if index not in self._sent_role:
                d["role"] = "assistant"
                self._sent_role.add(index)
            choice = {"index": index, "delta": d, "finish_reason": finish_reason, "logprobs": self._logprobs(logprobs, index)}
            events = [self._envelope("chat.completion.chunk", [choice])]
        if last:
            if self.include_usage:
                kind = "text_completion" if self.api == "completions" else "chat.completion.chunk"
                events.append(self._envelope(kind, []) | {"usage": usage.body()})
            events.append("[DONE]")
        head = "" if event_id is None else f"id: {event_id}\n"
        return "".join(f"{head}data: {e if isinstance(e, str) else json.dumps(e)}\n\n" for e in events)

    def keepalive(self) -> str:
        """What a stream that has nothing to send may send instead: an SSE comment (NDJSON has none)."""
        return "" if self.api == "native" else SSE_KEEPALIVE

    def error_event(self, message: str, status: int = 500) -> str:
        """The last piece of a stream cut by a server fault or shutdown (its 200 was sent with the
        first piece): an error object where the client reads pieces, as OpenAI-compatible servers
        send it; `status` is the code the error object carries (503: retry elsewhere)."""
        body = error_body(message, status)
        return body + "\n" if self.api == "native" else f"data: {body}\n\n"

    def resume_event(self, message: str, resume_id: str) -> str:
        """The last piece of a resumable stream cut by the replica's shutdown, its record written:
        an error (503) that names the id to resume from, as the event's `id` (and SSE's `retry:`)."""
        body = error_object(message, 503)
        body["error"]["resume"] = resume_id
        if self.api == "native":
            return json.dumps(body | {"resume": resume_id}) + "\n"
        return f"retry: {RETRY_MS}\nid: {resume_id}\ndata: {json.dumps(body)}\n\n"

    def resumed(self, points: Sequence[int]) -> None:
        """A resumed stream's: its client holds points[i] characters of choice i (and its chat
        role, once any of its events was sent: handler.resume.ids)."""
        for index, point in enumerate(points):
            if point:
                self._sent_role.add(index)
            self._text_offset[index] = point

    def _logprobs(self, logprobs: Sequence[TokenLogprob] | None, index: int = 0) -> dict | None:
        """OpenAI's shapes: completions' parallel lists (top_logprobs null per token when k is 0),
        chat's list of objects with each token's UTF-8 bytes."""
        if logprobs is None:
            return None
        texts = [self.token_text(lp.token_id) for lp in logprobs]
        if self.api == "completions":
            offsets = list(accumulate((len(t) for t in texts), initial=self._text_offset.get(index, 0)))
            self._text_offset[index] = offsets.pop()
            return {"tokens": texts, "token_logprobs": [lp.logprob for lp in logprobs],
                    "top_logprobs": [{self.token_text(i): v for i, v in lp.top} or None for lp in logprobs],
                    "text_offset": offsets}
        return {"content": [self._chat_logprob(text, lp.logprob) | {"top_logprobs": [
            self._chat_logprob(self.token_text(i), v) for i, v in lp.top]} for text, lp in zip(texts, logprobs)]}

    @staticmethod
    def _chat_logprob(text: str, logprob: float) -> dict:
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}

    def _envelope(self, kind: str, choices: list) -> dict:
        prefix = "chatcmpl-" if kind.startswith("chat") else "cmpl-"
        return {"id": prefix + self.id, "object": kind, "created": self.created, "model": self.model, "choices": choices}


def _message(c: Choice) -> dict:
    if not c.tool_calls:
        return {"role": "assistant", "content": c.text}
    return {"role": "assistant", "content": c.text or None, "tool_calls": [call.body() for call in c.tool_calls]}
