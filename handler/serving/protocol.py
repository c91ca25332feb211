"""Parse and validate a request body into a GenerationRequest, or raise RequestError (a 4xx).

Three APIs share one engine: the native JSON API (`/predictions/<model>`) and OpenAI-style
`v1/completions` and `v1/chat/completions` (TorchServe passes the URL suffix as `url_path`).
`v1/models` (OpenAI's model list) and `v1/models/<id>` (retrieve) ask nothing of the engine:
models_route, answered by the service.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from handler.engine.kv.pages import PAGE
from handler.engine.kv.slot_memory import promised_pages
from handler.engine.sampling import SamplingParams
from handler.serving.request_fields import Limits, RequestError, get_field
from handler.serving.sampling_fields import sampling_params
from handler.serving.tools import ToolsError, ToolSpec, generic_messages, parse_tools, template_message

API_BY_PATH = {"": "native", "v1/completions": "completions", "v1/chat/completions": "chat"}
MODEL_LIST_PATH = "v1/models"
ROLES = ("system", "user", "assistant", "tool")
MESSAGE_KEYS = {"role", "content", "name", "tool_calls", "tool_call_id"}


@dataclass(frozen=True)
class GenerationRequest:
    api: str  # "native", "completions" or "chat"
    prompt_ids: list[int]
    params: SamplingParams
    stream: bool
    include_usage: bool = False  # OpenAI stream_options.include_usage
    n: int = 1  # completions of the prompt (OpenAI's n)
    tools: ToolSpec | None = None  # the functions the answer may call (chat's `tools`)

    def sample_params(self) -> list[SamplingParams]:
        """Each completion's: with a seed, completion i samples with seed + i (reproducible, distinct)."""
        if self.params.seed is None:
            return [self.params] * self.n
        return [replace(self.params, seed=self.params.seed + i) for i in range(self.n)]


# Fields each API accepts; anything else is rejected by name.
_CONTROLS = {"frequency_penalty", "presence_penalty", "repetition_penalty", "logit_bias", "min_tokens", "stop_token_ids"}
_COMMON = {"max_new_tokens", "temperature", "top_p", "top_k", "seed", "stop", "stream", "ignore_eos", "response_format"}
FIELDS = {
    "native": _COMMON | _CONTROLS | {"prompt", "messages", "resume"},  # resume: handler.serving.lifecycle.resume
    "completions": _CONTROLS | {"model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "stream",
                                "stream_options", "n", "best_of", "user", "ignore_eos", "logprobs", "response_format",
                                "echo", "suffix"},
    "chat": _CONTROLS | {"model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "seed",
                         "stop", "stream", "stream_options", "n", "user", "ignore_eos", "logprobs", "top_logprobs",
                         "response_format", "tools", "tool_choice", "parallel_tool_calls"},
}


def models_route(url_path: str) -> str | None:
    """None: not OpenAI's models route; "": the model list; else the model id asked for (retrieve)."""
    path = url_path.strip("/")
    if path == MODEL_LIST_PATH:
        return ""
    prefix = MODEL_LIST_PATH + "/"
    return path[len(prefix):] if path.startswith(prefix) and len(path) > len(prefix) else None


def check_model(model: str, served: str) -> None:
    """A 404 for a model id this endpoint does not serve (a request's `model`, or models/{id})."""
    if model != served:
        raise RequestError(f"model {model!r} does not exist; this endpoint serves {served!r}", status=404)


def api_for_path(url_path: str) -> str:
    path = url_path.strip("/")
    if path not in API_BY_PATH:
        known = ", ".join(repr(p) for p in [*API_BY_PATH, MODEL_LIST_PATH] if p)
        raise RequestError(f"unknown route {path!r} after the model version; use {known}", status=404)
    return API_BY_PATH[path]


def decode_body(body: Any) -> dict:
    if body is None:
        # TorchServe passes form-encoded bodies (curl -d without a Content-Type) as form fields.
        raise RequestError("request body is missing or was sent as a form; send a JSON object with "
                           "Content-Type: application/json")
    if isinstance(body, (bytes, bytearray)):
        try:
            body = bytes(body).decode("utf-8")
        except UnicodeDecodeError as err:
            raise RequestError(f"request body is not valid UTF-8 (byte {err.start}); send UTF-8 encoded JSON") from err
    if isinstance(body, str):
        if not body.strip():
            raise RequestError("request body is empty; send a JSON object such as {\"prompt\": \"Hello\"}")
        try:
            body = json.loads(body)
        except json.JSONDecodeError as err:
            raise RequestError(f"request body is not valid JSON: {err.msg} at line {err.lineno} column {err.colno}") from err
    if not isinstance(body, dict):
        raise RequestError(f"request body must be a JSON object, got {type(body).__name__}")
    return body


def parse_request(body: Any, url_path: str, encode: Callable[[str], list[int]],
                  encode_chat: Callable[[list[dict], list[dict] | None], list[int]], limits: Limits) -> GenerationRequest:
    api = api_for_path(url_path)
    data = decode_body(body)
    unknown = sorted(set(data) - FIELDS[api])
    if unknown:
        raise RequestError(f"unknown field(s) {', '.join(map(repr, unknown))}; allowed: {', '.join(sorted(FIELDS[api]))}")
    if api != "native":
        _check_openai_extras(data, limits)
    n = _n(data, limits) if api != "native" else 1
    try:
        tools = parse_tools(data, limits.tool_format) if api == "chat" else None
        prompt_ids = _prompt_ids(api, data, encode, encode_chat, tools, limits.tool_format)
    except ToolsError as err:  # malformed `tools`, or a malformed tool message
        raise RequestError(str(err)) from err
    params = sampling_params(api, data, limits)
    if tools is not None and tools.constrained:
        if params.json_schema is not None:
            raise RequestError("send `response_format` or `tools` (with `tool_choice` other than \"none\"), not both")
        params = replace(params, json_schema=tools.schema())
    if len(prompt_ids) + params.max_new_tokens > limits.max_seq_len:
        raise RequestError(
            f"prompt is {len(prompt_ids)} tokens and max_new_tokens is {params.max_new_tokens}: together they exceed "
            f"the context of {limits.max_seq_len} tokens; shorten the prompt or lower max_new_tokens")
    if limits.kv_pages is not None and n * promised_pages(len(prompt_ids), params.max_new_tokens) > limits.kv_pages:
        raise RequestError(
            f"{n} samples of a {len(prompt_ids)}-token prompt and {params.max_new_tokens} new tokens could fill more "
            f"than this replica's KV cache of {limits.kv_pages * PAGE} positions; lower n or max_new_tokens")
    stream = get_field(data, "stream", bool, False)
    options = get_field(data, "stream_options", dict, {}) or {}
    return GenerationRequest(api, prompt_ids, params, stream, bool(options.get("include_usage", False)), n, tools)


def _check_openai_extras(data: dict, limits: Limits) -> None:
    model = get_field(data, "model", str, None)
    if model is not None:
        check_model(model, limits.served_model_name)
    if "best_of" in data:
        raise RequestError("`best_of` is not supported (it would rank completions server-side); ask for `n` completions "
                           "with `logprobs` and rank them yourself")
    if get_field(data, "echo", bool, False):
        raise RequestError("`echo` is not supported; the prompt is yours already: prepend it to the completion")
    if get_field(data, "suffix", str, None):
        raise RequestError("`suffix` (fill-in-the-middle) is not supported; send the text before the gap as `prompt`")


def _n(data: dict, limits: Limits) -> int:
    n = get_field(data, "n", int, 1)
    if not 1 <= n <= limits.max_n:
        raise RequestError(f"`n` must be between 1 and {limits.max_n}, got {n}")
    return n


def _prompt_ids(api: str, data: dict, encode, encode_chat, tools: ToolSpec | None, tool_format: str) -> list[int]:
    has_prompt, has_messages = "prompt" in data, "messages" in data
    if api == "native" and has_prompt == has_messages:
        raise RequestError("send exactly one of `prompt` (a string) or `messages` (a chat)")
    if api == "chat" or (api == "native" and has_messages):
        return _chat_ids(data.get("messages"), encode_chat, tools, tool_format)
    prompt = data.get("prompt")
    if api == "completions" and isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]  # OpenAI clients may wrap a single prompt in a list
    if not isinstance(prompt, str):
        raise RequestError(f"`prompt` must be a string, got {type(prompt).__name__}")
    if not prompt.strip():
        raise RequestError("`prompt` is empty; send some text to complete")
    return encode(prompt)


def _chat_ids(messages: Any, encode_chat, tools: ToolSpec | None, tool_format: str) -> list[int]:
    if not isinstance(messages, list) or not messages:
        raise RequestError("`messages` must be a non-empty list of {\"role\": ..., \"content\": ...} objects")
    clean = [_message(m, i) for i, m in enumerate(messages)]
    if not any(m["content"].strip() or m.get("tool_calls") for m in clean):
        raise RequestError("every message in `messages` is empty; send some text")
    if tool_format == "generic":  # earlier calls and results too, with tool_choice "none" or no tools
        clean = generic_messages(clean, tools)
    try:
        return encode_chat(clean, tools.template_tools() if tools is not None else None)
    except ValueError as err:  # no chat template, or the template refused the messages
        raise RequestError(str(err)) from err


def _message(m: Any, i: int) -> dict:
    if not isinstance(m, dict) or set(m) - MESSAGE_KEYS or "role" not in m:
        raise RequestError(f"messages[{i}] must be an object with `role` and `content`")
    if m["role"] not in ROLES:
        raise RequestError(f"messages[{i}].role must be one of {', '.join(ROLES)}, got {m['role']!r}")
    calls = m["role"] == "assistant" and m.get("tool_calls")
    if m.get("content") is None and not calls:
        raise RequestError(f"messages[{i}] must be an object with `role` and `content`")
    clean = {"role": m["role"], "content": _message_text(m.get("content") or "", i)}
    return template_message(m | clean, i) if m["role"] == "tool" or calls else clean


def _message_text(content: Any, i: int) -> str:
    if isinstance(content, str):
        return content
    # OpenAI's list-of-parts form; only text parts are meaningful to a text model.
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    raise RequestError(f"messages[{i}].content must be a string or a list of text parts")
