"""The tool calls in a model's answer (tools.py says which format it writes), whole or streamed.

Streamed, text before a call goes out as it comes (a tail that could start a call marker is held
back); from the marker on, the answer is held and its calls go out parsed when it ends, as
OpenAI's `delta.tool_calls`. A constrained answer (TOOL_CALLS_SCHEMA's JSON) is held whole. What
does not parse as a call (a cut answer, a malformed block) is content, never dropped."""
from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

from handler.engine.sequence import stop_prefix_len
from handler.serving.tools import ToolSpec

HERMES_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
HERMES_MARKER = "<tool_call>"
PYTHON_TAG = "<|python_tag|>"


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text, as OpenAI sends it

    def body(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def parse_answer(text: str, spec: ToolSpec) -> tuple[str | None, list[ToolCall]]:
    """(content, calls) of a whole answer; content None when the answer is only calls."""
    if spec.constrained:
        return _constrained(text)
    if spec.format == "hermes":
        calls = [c for c in (_call(block) for block in HERMES_CALL.findall(text)) if c is not None]
        if not calls:
            return text, []
        content = text[:text.index(HERMES_MARKER)].strip()
        return content or None, calls
    body = text.strip().removeprefix(PYTHON_TAG)  # llama3_json: the whole answer is one call
    call = _call(body) if body.lstrip().startswith("{") else None
    return (None, [call]) if call is not None else (text, [])


def _constrained(text: str) -> tuple[str | None, list[ToolCall]]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError:  # cut by max_tokens before the JSON closed
        return text, []
    if "response" in data:
        return data["response"], []
    return None, [_new_call(c["name"], c["arguments"]) for c in data["tool_calls"]]


def _call(block: str) -> ToolCall | None:
    try:
        data = json.loads(block)
    except json.JSONDecodeError:
        return None
    args = data.get("arguments", data.get("parameters")) if isinstance(data, dict) else None
    if not isinstance(data, dict) or not isinstance(data.get("name"), str) or not isinstance(args, (dict, str)):
        return None
    return _new_call(data["name"], args)


def _new_call(name: str, arguments: dict | str) -> ToolCall:
    text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return ToolCall("call_" + uuid.uuid4().hex[:24], name, text)


class ToolStream:
    """One sample's streamed answer: feed() each text delta and send what it returns; finish()
    gives the rest of the content and the calls."""

    def __init__(self, spec: ToolSpec):
        self.spec = spec
        self.text = ""
        self.sent = 0  # characters of text sent as content
        self.calling = spec.constrained  # a call has begun: hold the rest

    def feed(self, delta: str) -> str:
        self.text += delta
        if not self.calling:
            end = self._sendable()
            piece, self.sent = self.text[self.sent:end], max(self.sent, end)
            return piece
        return ""

    def last(self, delta: str) -> tuple[str, list[ToolCall]]:
        """The answer's last delta: the content to send (what feed lets out and the rest), and the calls."""
        text = self.feed(delta)
        rest, calls = self.finish()
        return text + rest, calls

    def finish(self) -> tuple[str, list[ToolCall]]:
        content, calls = parse_answer(self.text, self.spec)
        if calls:
            return "", calls
        if self.spec.constrained:
            return content or "", []
        return self.text[self.sent:], []

    def _sendable(self) -> int:
        """How much of the text may go out as content now; sets calling at a call's start."""
        if self.spec.format == "llama3_json":
            head = self.text.lstrip()
            if not head or PYTHON_TAG.startswith(head) or head.startswith(("{", PYTHON_TAG)):
                self.calling = bool(head) and not PYTHON_TAG.startswith(head)
                return self.sent
            return len(self.text)
        at = self.text.find(HERMES_MARKER)
        if at != -1:
            self.calling = True
            return at
        return len(self.text) - stop_prefix_len(self.text, (HERMES_MARKER,))
