"""Parsing of the sampling controls users send (OpenAI's penalties and logit_bias, vLLM's
repetition_penalty, min_tokens, stop_token_ids): valid values reach SamplingParams, bad ones are a
400 naming the field and its range."""
from __future__ import annotations

import pytest

from handler.serving.protocol import parse_request
from handler.serving.request_fields import Limits, RequestError

LIMITS = Limits(max_seq_len=64, max_new_tokens_cap=32, default_max_new_tokens=8, served_model_name="llm", vocab_size=100)
CHAT = "v1/chat/completions"


def parse(body: dict, path: str = CHAT):
    return parse_request(body, path, lambda t: [ord(c) % 100 for c in t], lambda m, tools: [1, 2], LIMITS)


def rejects(body: dict, path: str = CHAT) -> str:
    with pytest.raises(RequestError) as err:
        parse(body, path)
    assert err.value.status == 400
    return err.value.message


def _chat(**fields) -> dict:
    return {"messages": [{"role": "user", "content": "hi"}], **fields}


@pytest.mark.parametrize("path", ["", "v1/completions", CHAT])
def test_controls_reach_the_sampling_params_on_every_api(path):
    body = {"prompt": "hi"} if path != CHAT else _chat()
    body |= {"frequency_penalty": 0.5, "presence_penalty": -1, "repetition_penalty": 1.2, "logit_bias": {"7": -100, "3": 2.5},
             "min_tokens": 2, "stop_token_ids": [5, 9], "max_tokens" if path else "max_new_tokens": 8}
    p = parse(body, path).params
    assert (p.frequency_penalty, p.presence_penalty, p.repetition_penalty) == (0.5, -1.0, 1.2)
    assert p.logit_bias == ((3, 2.5), (7, -100.0)) and p.min_tokens == 2 and p.stop_token_ids == (5, 9)
    assert p.controls_logits


def test_no_controls_leave_the_logits_alone():
    assert not parse(_chat()).params.controls_logits


@pytest.mark.parametrize("field", ["frequency_penalty", "presence_penalty"])
def test_penalty_outside_openais_range_is_refused(field):
    assert f"`{field}` must be between -2 and 2, got 2.5" in rejects(_chat(**{field: 2.5}))


def test_repetition_penalty_must_be_positive():
    assert "`repetition_penalty` must be > 0" in rejects(_chat(repetition_penalty=0))


def test_logit_bias_token_outside_the_vocabulary_is_refused():
    assert "`logit_bias` takes token ids (integers >= 0 below 100), got 100" in rejects(_chat(logit_bias={"100": 1}))
    assert "got \"cat\"" in rejects(_chat(logit_bias={"cat": 1}))


def test_logit_bias_value_outside_openais_range_is_refused():
    assert "between -100 and 100, got 101 for token 5" in rejects(_chat(logit_bias={"5": 101}))


def test_stop_token_ids_must_be_token_ids():
    assert "`stop_token_ids` must be a list" in rejects(_chat(stop_token_ids=5))
    assert "`stop_token_ids` takes token ids" in rejects(_chat(stop_token_ids=[-1]))


def test_min_tokens_above_max_tokens_is_refused():
    assert "`min_tokens` must be between 0 and the request's max tokens (4), got 5" in rejects(_chat(min_tokens=5, max_tokens=4))


def test_echo_and_suffix_are_refused_with_what_to_do():
    assert "`echo` is not supported" in rejects({"prompt": "hi", "echo": True}, "v1/completions")
    assert "`suffix` (fill-in-the-middle) is not supported" in rejects({"prompt": "hi", "suffix": "x"}, "v1/completions")
    assert parse({"prompt": "hi", "echo": False, "suffix": ""}, "v1/completions").prompt_ids
