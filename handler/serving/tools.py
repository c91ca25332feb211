"""OpenAI's `tools` on a chat request: which functions, `tool_choice`, `parallel_tool_calls`; the
chat messages that carry tool calls and their results, in the form chat templates read
(transformers' convention); and how the model is asked to answer.

A model's own template renders `tools` where it can (Qwen's and Hermes' `<tool_call>`, Llama
3.x's JSON): the model answers in its own format, parsed by tool_calls.py. A template that knows
no tools gets them in a system message with a JSON reply format ("generic", as llama.cpp does).
`required` and a named function constrain the output with the grammar (TOOL_CALLS_SCHEMA's
shape, arguments valid for each function's schema), in every format; `auto` on a generic
template constrains it to a call or a `{"response": ...}` answer."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from handler.engine.grammar import schema_text

FORMATS = ("hermes", "llama3_json", "generic")
CHOICES = ("none", "auto", "required")
EMPTY_PARAMETERS = {"type": "object", "properties": {}}


class ToolsError(ValueError):
    """A malformed tools request; the message says what to fix (a 400)."""


@dataclass(frozen=True)
class Function:
    name: str
    description: str
    parameters: dict  # a JSON schema of the arguments object


@dataclass(frozen=True)
class ToolSpec:
    functions: tuple[Function, ...]
    choice: str  # "auto", "required", or the name of the function that must be called
    parallel: bool  # more than one call per answer
    format: str  # one of FORMATS: how the template and the model write a call

    @property
    def constrained(self) -> bool:
        """The output is the JSON of TOOL_CALLS_SCHEMA's shape (or a generic response), under the grammar."""
        return self.choice != "auto" or self.format == "generic"

    def request_fields(self) -> dict:
        """The request's fields that parse_tools reads back into this spec (a resume record's)."""
        choice = self.choice if self.choice in CHOICES else {"type": "function", "function": {"name": self.choice}}
        tools = [{"type": "function", "function": {"name": f.name, "description": f.description, "parameters": f.parameters}}
                 for f in self.functions]
        return {"tools": tools, "tool_choice": choice, "parallel_tool_calls": self.parallel}

    def template_tools(self) -> list[dict] | None:
        """What the template's `tools` gets: OpenAI's tool objects (None for a generic template)."""
        if self.format == "generic":
            return None
        return [{"type": "function", "function": {"name": f.name, "description": f.description,
                                                  "parameters": f.parameters}} for f in self.functions]

    def schema(self) -> str | None:
        """The JSON schema the output is constrained to (schema_text), or None for free text."""
        if not self.constrained:
            return None
        named = [f for f in self.functions if self.choice in ("auto", "required") or f.name == self.choice]
        calls: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": [_call_schema(f) for f in named]}}
        if not self.parallel or self.choice not in ("auto", "required"):
            calls["maxItems"] = 1
        envelope = _object({"tool_calls": calls})
        if self.choice == "auto":  # generic: a call or an answer in text
            return schema_text({"anyOf": [envelope, _object({"response": {"type": "string"}})]})
        return schema_text(envelope)


def tool_format(chat_template: str | None) -> str:
    """The tool-call format a chat template speaks, read from its text."""
    template = chat_template or ""
    if "tools" not in template:
        return "generic"
    if "<tool_call>" in template:
        return "hermes"
    if "<|python_tag|>" in template or "ipython" in template:
        return "llama3_json"
    return "generic"


def parse_tools(data: dict, fmt: str) -> ToolSpec | None:
    """The request's tools; None when it sends none or `tool_choice: "none"`."""
    tools, choice = data.get("tools"), data.get("tool_choice")
    if not tools:
        if choice not in (None, "none"):
            raise ToolsError("`tool_choice` needs `tools`")
        return None
    functions = _functions(tools)
    choice = _choice("auto" if choice is None else choice, {f.name for f in functions})
    if choice == "none":
        return None
    parallel = data.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise ToolsError(f"`parallel_tool_calls` must be true or false, got {json.dumps(parallel)}")
    return ToolSpec(functions, choice, parallel, fmt)


def _functions(tools: Any) -> tuple[Function, ...]:
    if not isinstance(tools, list):
        raise ToolsError("`tools` must be a list of {\"type\": \"function\", \"function\": {...}} objects")
    out = []
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) and tool.get("type") == "function" else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise ToolsError(f"tools[{i}] must be {{\"type\": \"function\", \"function\": {{\"name\": ..., \"parameters\": {{...}}}}}}")
        params = fn.get("parameters") or EMPTY_PARAMETERS
        if not isinstance(params, dict):
            raise ToolsError(f"tools[{i}].function.parameters must be a JSON schema object")
        out.append(Function(fn["name"], str(fn.get("description") or ""), params))
    names = [f.name for f in out]
    if len(set(names)) != len(names):
        raise ToolsError(f"tool names must be unique, got {', '.join(names)}")
    return tuple(out)


def _choice(choice: Any, names: set[str]) -> str:
    if isinstance(choice, str):
        if choice not in CHOICES:
            raise ToolsError(f"`tool_choice` must be one of {', '.join(CHOICES)} or a named function, got {choice!r}")
        return choice
    name = choice.get("function", {}).get("name") if isinstance(choice, dict) and choice.get("type") == "function" else None
    if not isinstance(name, str):
        raise ToolsError("a named `tool_choice` is {\"type\": \"function\", \"function\": {\"name\": ...}}")
    if name not in names:
        raise ToolsError(f"`tool_choice` names {name!r}, which is not in `tools` ({', '.join(sorted(names))})")
    return name


def _call_schema(f: Function) -> dict:
    return _object({"name": {"const": f.name}, "arguments": _declared_only(f.parameters)})


def _declared_only(parameters: dict) -> dict:
    """No argument the function does not declare, unless its schema allows them (as llama.cpp's
    grammars read a schema): a small model otherwise invents arguments until max_tokens."""
    if parameters.get("type") != "object" or "additionalProperties" in parameters:
        return parameters
    return parameters | {"additionalProperties": False}


def _object(properties: dict) -> dict:
    return {"type": "object", "properties": properties, "required": list(properties), "additionalProperties": False}


# ---- messages ---------------------------------------------------------------------------------

def template_message(m: dict, i: int) -> dict:
    """A tool message or an assistant message with tool_calls, as templates read them: each call's
    arguments parsed from OpenAI's JSON string into an object (what transformers' templates expect)."""
    if m["role"] == "tool":
        out = {"role": "tool", "content": m["content"]}
        if isinstance(m.get("tool_call_id"), str):
            out["tool_call_id"] = m["tool_call_id"]
        return out
    calls = m.get("tool_calls")
    if not isinstance(calls, list) or not calls:
        raise ToolsError(f"messages[{i}].tool_calls must be a non-empty list of calls")
    return {"role": "assistant", "content": m["content"], "tool_calls": [_template_call(c, i) for c in calls]}


def _template_call(call: Any, i: int) -> dict:
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise ToolsError(f"messages[{i}].tool_calls: each call is {{\"id\": ..., \"type\": \"function\", "
                         f"\"function\": {{\"name\": ..., \"arguments\": \"{{...}}\"}}}}")
    args = fn.get("arguments") or "{}"
    try:
        arguments = json.loads(args) if isinstance(args, str) else args
    except json.JSONDecodeError as err:
        raise ToolsError(f"messages[{i}].tool_calls: the arguments of {fn['name']!r} are not JSON ({err.msg})") from err
    return {"id": call.get("id", ""), "type": "function", "function": {"name": fn["name"], "arguments": arguments}}


def generic_messages(messages: list[dict], spec: ToolSpec | None) -> list[dict]:
    """Messages for a template that knows no tools: the tools (when offered) and the reply format
    in the system message; calls and results as the JSON the model is asked to write and to read."""
    out: list[dict] = []
    for m in messages:
        if m["role"] == "tool" and out and out[-1].get("results"):
            out[-1]["content"] += "\n" + _generic(m)["content"]  # one answer's results: one user turn
        else:
            out.append(_generic(m))
    out = [{k: v for k, v in m.items() if k != "results"} for m in out]
    if spec is None:
        return out
    listing = json.dumps([{"name": f.name, "description": f.description, "parameters": f.parameters}
                          for f in spec.functions], ensure_ascii=False, separators=(",", ":"))
    guide = (f"Tools: {listing}\nTo call tools, reply only with "
             '{"tool_calls":[{"name":...,"arguments":{...}}]}; otherwise reply only with {"response":"..."}.')
    if out and out[0]["role"] == "system":
        return [{"role": "system", "content": out[0]["content"] + "\n\n" + guide}, *out[1:]]
    return [{"role": "system", "content": guide}, *out]


def _generic(m: dict) -> dict:
    if m["role"] == "tool":
        result = {"tool_response": {"tool_call_id": m.get("tool_call_id"), "content": m["content"]}}
        # a user turn: templates such as Gemma 3's require user and assistant turns to alternate
        return {"role": "user", "content": json.dumps(result, ensure_ascii=False), "results": True}
    if m.get("tool_calls"):
        calls = [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]} for c in m["tool_calls"]]
        return {"role": "assistant", "content": json.dumps({"tool_calls": calls}, ensure_ascii=False)}
    return m

