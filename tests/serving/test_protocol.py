"""Request parsing and validation: every bad input becomes a RequestError whose message says what to fix."""
from __future__ import annotations

import json

import pytest

from handler.serving.protocol import parse_request
from handler.serving.request_fields import Limits, RequestError

LIMITS = Limits(max_seq_len=64, max_new_tokens_cap=32, default_max_new_tokens=8, served_model_name="llm")


def encode(text: str) -> list[int]:
    return [ord(c) for c in text]


def encode_chat(messages: list[dict], tools: list[dict] | None = None) -> list[int]:
    return encode("".join(f"<{m['role']}>{m['content']}" for m in messages))


def parse(body, path=""):
    return parse_request(body, path, encode, encode_chat, LIMITS)


def rejects(body, path="", status=400) -> str:
    with pytest.raises(RequestError) as err:
        parse(body, path)
    assert err.value.status == status
    return err.value.message


def test_native_prompt_defaults():
    req = parse({"prompt": "hi"})
    assert req.api == "native" and req.prompt_ids == [104, 105]
    assert req.params.max_new_tokens == 8 and req.params.greedy and not req.stream


def test_body_as_bytes_and_str_are_decoded():
    assert parse(json.dumps({"prompt": "a"}).encode()).prompt_ids == [97]
    assert parse(json.dumps({"prompt": "a"})).prompt_ids == [97]


def test_malformed_json():
    assert "not valid JSON" in rejects(b'{"prompt": ')


def test_invalid_utf8():
    assert "not valid UTF-8" in rejects(b'{"prompt": "\xff\xfe"}')


def test_missing_body_says_to_send_json():
    assert "Content-Type: application/json" in rejects(None)


def test_body_must_be_an_object():
    assert "must be a JSON object" in rejects([1, 2])


def test_unknown_field_is_named():
    assert "'temprature'" in rejects({"prompt": "a", "temprature": 1})


def test_wrong_types_are_named():
    assert "`max_new_tokens` must be an integer" in rejects({"prompt": "a", "max_new_tokens": "5"})
    assert "`stream` must be true or false" in rejects({"prompt": "a", "stream": "yes"})
    assert "`temperature` must be a number" in rejects({"prompt": "a", "temperature": True})
    assert "`prompt` must be a string" in rejects({"prompt": 5})


def test_empty_prompt():
    assert "empty" in rejects({"prompt": "   "})


def test_prompt_and_messages_together():
    assert "exactly one" in rejects({"prompt": "a", "messages": [{"role": "user", "content": "b"}]})


def test_prompt_longer_than_context():
    message = rejects({"prompt": "x" * 60, "max_new_tokens": 8})
    assert "exceed the context of 64 tokens" in message


def test_max_new_tokens_over_cap():
    assert "between 1 and 32" in rejects({"prompt": "a", "max_new_tokens": 33})


def test_temperature_out_of_range():
    assert "temperature must be >= 0" in rejects({"prompt": "a", "temperature": -0.5})
    assert "temperature must be at most 100" in rejects({"prompt": "a", "temperature": 1000})


def test_openai_limit_error_names_the_field_the_client_sent():
    assert "max_tokens must be between 1 and 32" in rejects({"prompt": "a", "max_tokens": 99}, "v1/completions")


def test_top_p_out_of_range():
    assert "top_p" in rejects({"prompt": "a", "top_p": 0})


def test_stop_validation():
    assert parse({"prompt": "a", "stop": "\n"}).params.stop == ("\n",)
    assert "stop" in rejects({"prompt": "a", "stop": ["", "x"]})
    assert "at most 4" in rejects({"prompt": "a", "stop": list("abcde")})


def test_chat_messages_validated():
    assert "role must be one of" in rejects({"messages": [{"role": "robot", "content": "a"}]})
    assert "non-empty list" in rejects({"messages": []})
    req = parse({"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]})
    assert req.prompt_ids == encode("<user>hi")


def test_openai_completions_defaults_and_model_check():
    req = parse({"model": "llm", "prompt": ["hi"]}, "v1/completions")
    assert req.api == "completions" and req.params.max_new_tokens == 16 and req.params.temperature == 1.0
    assert "does not exist" in rejects({"model": "gpt-4", "prompt": "hi"}, "v1/completions", status=404)


def test_n_completions_seed_each_with_seed_plus_index():
    req = parse({"prompt": "hi", "n": 3, "seed": 7, "temperature": 1}, "v1/completions")
    assert req.n == 3 and [p.seed for p in req.sample_params()] == [7, 8, 9]
    assert [p.seed for p in parse({"prompt": "hi", "n": 2}, "v1/completions").sample_params()] == [None, None]


@pytest.mark.parametrize("n", [0, 9])
def test_n_out_of_range_is_refused(n):
    assert "`n` must be between 1 and 8" in rejects({"prompt": "hi", "n": n}, "v1/completions")


def test_n_is_bounded_by_the_slots():
    limits = Limits(max_seq_len=64, max_new_tokens_cap=32, default_max_new_tokens=8, served_model_name="llm", max_n=2)
    with pytest.raises(RequestError, match="between 1 and 2"):
        parse_request({"prompt": "hi", "n": 3}, "v1/completions", encode, encode_chat, limits)


def test_best_of_is_refused_with_what_to_do_instead():
    assert "ask for `n` completions" in rejects({"prompt": "hi", "best_of": 2}, "v1/completions")


def test_openai_chat_max_completion_tokens():
    req = parse({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 3, "stream": True,
                 "stream_options": {"include_usage": True}}, "/v1/chat/completions")
    assert req.params.max_new_tokens == 3 and req.stream and req.include_usage


def test_unknown_route_is_404():
    assert "unknown route 'v1/embeddings'" in rejects({"prompt": "a"}, "v1/embeddings", status=404)


def test_completions_logprobs_is_the_number_of_alternatives():
    assert parse({"prompt": "hi", "logprobs": 3}, "v1/completions").params.logprobs == 3
    assert parse({"prompt": "hi", "logprobs": 0}, "v1/completions").params.logprobs == 0
    assert parse({"prompt": "hi"}, "v1/completions").params.logprobs is None


def test_chat_logprobs_take_top_logprobs_alternatives():
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    assert parse(chat | {"logprobs": True, "top_logprobs": 4}, "v1/chat/completions").params.logprobs == 4
    assert parse(chat | {"logprobs": True}, "v1/chat/completions").params.logprobs == 0
    assert parse(chat | {"logprobs": False}, "v1/chat/completions").params.logprobs is None


def test_top_logprobs_without_logprobs_is_refused():
    chat = {"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}
    assert "needs `logprobs: true`" in rejects(chat, "v1/chat/completions")


@pytest.mark.parametrize("k", [-1, 21])
def test_logprobs_out_of_range_are_refused(k):
    assert "between 0 and 20" in rejects({"prompt": "hi", "logprobs": k}, "v1/completions")
    chat = {"messages": [{"role": "user", "content": "hi"}], "logprobs": True, "top_logprobs": k}
    assert "`top_logprobs` must be between 0 and 20" in rejects(chat, "v1/chat/completions")


def test_native_api_has_no_logprobs():
    assert "unknown field(s) 'logprobs'" in rejects({"prompt": "hi", "logprobs": 2})


# ---- response_format: structured output -----------------------------------------------------

def test_response_format_json_schema_becomes_its_compact_text_in_its_own_order():
    fmt = {"type": "json_schema", "json_schema": {"name": "p", "schema": {"type": "object", "required": ["a"]}}}
    params = parse({"prompt": "hi", "response_format": fmt}, "v1/completions").params
    assert params.json_schema == '{"type":"object","required":["a"]}'


def test_response_format_json_object_is_any_object():
    msgs = [{"role": "user", "content": "hi"}]
    assert parse({"messages": msgs, "response_format": {"type": "json_object"}}, "v1/chat/completions").params.json_schema \
        == '{"type": "object"}'


def test_response_format_text_is_free_text():
    assert parse({"prompt": "hi", "response_format": {"type": "text"}}, "v1/completions").params.json_schema is None
    assert parse({"prompt": "hi"}, "v1/completions").params.json_schema is None


def test_response_format_of_an_unknown_type_names_the_types():
    message = rejects({"prompt": "hi", "response_format": {"type": "xml"}}, "v1/completions")
    assert message == '`response_format.type` must be one of text, json_object, json_schema, got "xml"'


def test_response_format_json_schema_needs_its_schema():
    message = rejects({"prompt": "hi", "response_format": {"type": "json_schema", "json_schema": {"name": "p"}}},
                      "v1/completions")
    assert "needs `json_schema: {\"name\": ..., \"schema\": {...}}`" in message


def test_a_malformed_tool_message_is_a_400_that_names_it():
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{"}}
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": [call]}]
    assert "messages[1].tool_calls: the arguments of 'f' are not JSON" in rejects({"messages": msgs}, "v1/chat/completions")
    assert "messages[1] must be an object with `role` and `content`" in rejects(
        {"messages": [msgs[0], {"role": "assistant", "content": None}]}, "v1/chat/completions")
