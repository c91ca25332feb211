"""Response bodies for the native API and the OpenAI-style routes (whole and streamed)."""
from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def error_body(message: str, status: int) -> str:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return json.dumps({"error": {"message": message, "type": kind, "code": status}})


def model_list_body(model: str, created: int) -> str:
    """OpenAI's `GET /v1/models`: the one model this endpoint serves."""
    return json.dumps({"object": "list", "data": [{"id": model, "object": "model", "created": created,
                                                   "owned_by": "ts-llm"}]})


@dataclass
class Formatter:
    api: str  # "native", "completions" or "chat"
    model: str
    include_usage: bool = False
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: int = field(default_factory=lambda: int(time.time()))
    _sent_role: bool = False

    def content_type(self, stream: bool) -> str:
        if not stream:
            return "application/json"
        return "application/x-ndjson" if self.api == "native" else "text/event-stream"

    def whole(self, text: str, finish_reason: str, prompt_tokens: int, completion_tokens: int) -> str:
        u = usage(prompt_tokens, completion_tokens)
        if self.api == "native":
            return json.dumps({"id": self.id, "text": text, "finish_reason": finish_reason, "usage": u})
        if self.api == "completions":
            choice = {"index": 0, "text": text, "finish_reason": finish_reason, "logprobs": None}
            return json.dumps(self._envelope("text_completion", [choice]) | {"usage": u})
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish_reason}
        return json.dumps(self._envelope("chat.completion", [choice]) | {"usage": u})

    def chunk(self, delta: str, finish_reason: str | None, prompt_tokens: int, completion_tokens: int) -> str:
        """One streamed piece: NDJSON line (native) or server-sent events (OpenAI)."""
        if self.api == "native":
            piece = {"text": delta, "finish_reason": finish_reason}
            if finish_reason is not None:
                piece["usage"] = usage(prompt_tokens, completion_tokens)
            return json.dumps(piece) + "\n"
        if self.api == "completions":
            choice = {"index": 0, "text": delta, "finish_reason": finish_reason, "logprobs": None}
            events = [self._envelope("text_completion", [choice])]
        else:
            d = {"content": delta}
            if not self._sent_role:
                d["role"] = "assistant"
                self._sent_role = True
            events = [self._envelope("chat.completion.chunk", [{"index": 0, "delta": d, "finish_reason": finish_reason}])]
        out = "".join(f"data: {json.dumps(e)}\n\n" for e in events)
        if finish_reason is not None:
            if self.include_usage:
                kind = "text_completion" if self.api == "completions" else "chat.completion.chunk"
                out += f"data: {json.dumps(self._envelope(kind, []) | {'usage': usage(prompt_tokens, completion_tokens)})}\n\n"
            out += "data: [DONE]\n\n"
        return out

    def error_event(self, message: str, status: int = 500) -> str:
        """The last piece of a stream cut by a server fault or shutdown (its 200 was sent with the
        first piece): an error object where the client reads pieces, as OpenAI-compatible servers
        send it; `status` is the code the error object carries (503: retry elsewhere)."""
        body = error_body(message, status)
        return body + "\n" if self.api == "native" else f"data: {body}\n\n"

    def _envelope(self, kind: str, choices: list) -> dict:
        prefix = "chatcmpl-" if kind.startswith("chat") else "cmpl-"
        return {"id": prefix + self.id, "object": kind, "created": self.created, "model": self.model, "choices": choices}
