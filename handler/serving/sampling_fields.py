"""A request's sampling fields into SamplingParams, each checked: the native API's names and
OpenAI's (max_tokens, logprobs / top_logprobs, response_format, logit_bias, penalties), with
OpenAI's ranges and defaults."""
from __future__ import annotations

import json
from typing import Any

from handler.engine.grammar import ANY_OBJECT, schema_text
from handler.engine.sampling import MAX_TOP_LOGPROBS, SamplingParams
from handler.serving.request_fields import Limits, RequestError, get_field

MAX_STOP_STRINGS = 4
MAX_TEMPERATURE = 100.0
MAX_PENALTY = 2.0  # OpenAI's range for frequency_penalty and presence_penalty: -2..2
MAX_LOGIT_BIAS = 100.0  # OpenAI's: -100..100
FORMAT_TYPES = ("text", "json_object", "json_schema")


def sampling_params(api: str, data: dict, limits: Limits) -> SamplingParams:
    """How the request asks to sample: its length, temperature, nucleus, seed, stops, log-probabilities,
    output format and logit controls, each checked against OpenAI's ranges and `limits`."""
    if api == "native":
        max_new = get_field(data, "max_new_tokens", int, limits.default_max_new_tokens)
        temperature = get_field(data, "temperature", float, 0.0)
    else:
        # OpenAI defaults: max_tokens 16 for completions, temperature 1.0.
        default = 16 if api == "completions" else limits.default_max_new_tokens
        max_new = get_field(data, "max_completion_tokens", int, None) or get_field(data, "max_tokens", int, default)
        temperature = get_field(data, "temperature", float, 1.0)
    field = "max_new_tokens" if api == "native" else "max_completion_tokens" if "max_completion_tokens" in data else "max_tokens"
    if not 1 <= max_new <= limits.max_new_tokens_cap:
        raise RequestError(f"{field} must be between 1 and {limits.max_new_tokens_cap}, got {max_new}")
    if temperature < 0.0:
        raise RequestError(f"temperature must be >= 0 (0 means greedy), got {temperature}")
    if temperature > MAX_TEMPERATURE:
        raise RequestError(f"temperature must be at most {MAX_TEMPERATURE:g}, got {temperature}")
    top_p = get_field(data, "top_p", float, 1.0)
    if not 0.0 < top_p <= 1.0:
        raise RequestError(f"top_p must be in (0, 1], got {top_p}")
    top_k = get_field(data, "top_k", int, 0)
    if top_k < 0:
        raise RequestError(f"top_k must be >= 0 (0 turns it off), got {top_k}")
    seed = get_field(data, "seed", int, None)
    ignore_eos = get_field(data, "ignore_eos", bool, False)  # benchmarks: always produce max_new_tokens
    return SamplingParams(max_new, temperature, top_k, top_p, seed, _stop(data.get("stop")), ignore_eos,
                          _logprobs(api, data), _json_schema(data), **_logit_controls(data, max_new, limits))


def _logit_controls(data: dict, max_new: int, limits: Limits) -> dict:
    controls: dict[str, Any] = {}
    for name in ("frequency_penalty", "presence_penalty"):
        controls[name] = value = get_field(data, name, float, 0.0)
        if not -MAX_PENALTY <= value <= MAX_PENALTY:
            raise RequestError(f"`{name}` must be between -{MAX_PENALTY:g} and {MAX_PENALTY:g}, got {value:g}")
    controls["repetition_penalty"] = value = get_field(data, "repetition_penalty", float, 1.0)
    if value <= 0.0:
        raise RequestError(f"`repetition_penalty` must be > 0 (1 turns it off), got {value:g}")
    controls["min_tokens"] = value = get_field(data, "min_tokens", int, 0)
    if not 0 <= value <= max_new:
        raise RequestError(f"`min_tokens` must be between 0 and the request's max tokens ({max_new}), got {value}")
    controls["logit_bias"] = _logit_bias(get_field(data, "logit_bias", dict, {}), limits)
    ids = get_field(data, "stop_token_ids", list, [])
    controls["stop_token_ids"] = tuple(_token_id(i, "stop_token_ids", limits) for i in ids)
    return controls


def _logit_bias(bias: dict, limits: Limits) -> tuple[tuple[int, float], ...]:
    """OpenAI's logit_bias: {"token id": bias}, the id a string (JSON keys are)."""
    out = []
    for key, value in bias.items():
        token = _token_id(int(key) if key.strip().isdigit() else key, "logit_bias", limits)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not -MAX_LOGIT_BIAS <= value <= MAX_LOGIT_BIAS:
            raise RequestError(f"`logit_bias` values must be numbers between -{MAX_LOGIT_BIAS:g} and "
                               f"{MAX_LOGIT_BIAS:g}, got {json.dumps(value)} for token {key}")
        out.append((token, float(value)))
    return tuple(sorted(out))


def _token_id(value: Any, name: str, limits: Limits) -> int:
    top = limits.vocab_size
    if isinstance(value, bool) or not isinstance(value, int) or value < 0 or (top is not None and value >= top):
        below = f" below {top}" if top is not None else ""
        raise RequestError(f"`{name}` takes token ids (integers >= 0{below}), got {json.dumps(value)}")
    return value


def _logprobs(api: str, data: dict) -> int | None:
    """How many alternatives each token's log-probability comes with; None when none are asked."""
    if api == "completions":  # logprobs: k
        k, name = get_field(data, "logprobs", int, None), "logprobs"
    elif api == "chat":  # logprobs: true, top_logprobs: k
        k, name = get_field(data, "top_logprobs", int, None), "top_logprobs"
        if not get_field(data, "logprobs", bool, False):
            if k is not None:
                raise RequestError("`top_logprobs` needs `logprobs: true`")
            return None
        k = k or 0
    else:
        return None
    if k is not None and not 0 <= k <= MAX_TOP_LOGPROBS:
        raise RequestError(f"`{name}` must be between 0 and {MAX_TOP_LOGPROBS}, got {k}")
    return k


def _json_schema(data: dict) -> str | None:
    """OpenAI's response_format as the JSON schema the output must follow (schema_text); None
    for free text. Whether the engine can compile the schema is checked by the service."""
    fmt = get_field(data, "response_format", dict, None)
    if fmt is None or fmt.get("type") == "text":
        return None
    kind = fmt.get("type")
    if kind == "json_object":
        return ANY_OBJECT
    if kind != "json_schema":
        raise RequestError(f"`response_format.type` must be one of {', '.join(FORMAT_TYPES)}, got {json.dumps(kind)}")
    spec = fmt.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
        raise RequestError("`response_format` of type json_schema needs `json_schema: {\"name\": ..., \"schema\": {...}}` "
                           "with the schema as an object")
    return schema_text(spec["schema"])


def _stop(stop: Any) -> tuple[str, ...]:
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise RequestError("`stop` must be a non-empty string or a list of non-empty strings")
    if len(stops) > MAX_STOP_STRINGS:
        raise RequestError(f"at most {MAX_STOP_STRINGS} stop strings are allowed, got {len(stops)}")
    return tuple(stops)
