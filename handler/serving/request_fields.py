"""What every part of a request's parsing shares: the 4xx it raises (RequestError), the limits the
service sets (Limits) and reading one typed field of the body (get_field)."""
from __future__ import annotations

import json
from dataclasses import dataclass

MAX_N = 8  # OpenAI's n: completions of one prompt, each in a KV-cache slot of its own


class RequestError(ValueError):
    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.message, self.status = message, status


@dataclass(frozen=True)
class Limits:
    max_seq_len: int
    max_new_tokens_cap: int
    default_max_new_tokens: int
    served_model_name: str
    max_n: int = MAX_N  # at most the engine's slots
    vocab_size: int | None = None  # the tokenizer's: token ids in logit_bias / stop_token_ids must be below it
    tool_format: str = "generic"  # how the model's chat template writes tool calls (tools.tool_format)
    kv_pages: int | None = None  # the engine's KV cache (handler.engine.kv.pages): what n samples together may fill


def get_field(data: dict, key: str, kind: type, default):
    """data[key] if it is of `kind` (an int is a float too; a bool is neither), `default` when absent or
    null; else a RequestError that names the field and what it must be."""
    if key not in data or data[key] is None:
        return default
    value = data[key]
    ok = isinstance(value, kind) and not (kind in (int, float) and isinstance(value, bool))
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        ok = True
    if not ok:
        names = {int: "an integer", float: "a number", bool: "true or false", str: "a string", dict: "an object",
                 list: "a list"}
        raise RequestError(f"`{key}` must be {names[kind]}, got {json.dumps(value)}")
    return float(value) if kind is float else value
