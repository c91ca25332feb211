"""The OpenAI-style routes, called with the official OpenAI client pointed at TorchServe."""
from __future__ import annotations

import json

import jsonschema
import openai
import pytest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.inference_url}/predictions/llm/1.0/v1", api_key=server.token(), max_retries=0)


def test_completions(client):
    r = client.completions.create(model="llm", prompt="The capital of Italy is", max_tokens=8, temperature=0)
    assert r.object == "text_completion" and r.choices[0].text.strip()
    assert r.usage.completion_tokens <= 8


def test_completions_stream_equals_whole(client):
    whole = client.completions.create(model="llm", prompt="Roses are red,", max_tokens=10, temperature=0)
    chunks = list(client.completions.create(model="llm", prompt="Roses are red,", max_tokens=10, temperature=0, stream=True))
    assert len(chunks) > 2
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text


def test_chat_completions(client):
    r = client.chat.completions.create(model="llm", messages=[{"role": "user", "content": "Name a color."}],
                                       max_tokens=10, temperature=0)
    assert r.object == "chat.completion" and r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content.strip()


def test_penalties_logit_bias_and_vllm_controls_reach_the_engine(client):
    r = client.chat.completions.create(model="llm", messages=[{"role": "user", "content": "Name a color."}], max_tokens=4,
                                       temperature=0, logit_bias={"28": 100}, frequency_penalty=0.5, presence_penalty=0.5,
                                       extra_body={"repetition_penalty": 1.1, "min_tokens": 4, "stop_token_ids": [2]})
    assert r.choices[0].message.content == ",,,," and r.choices[0].finish_reason == "length"


def test_chat_stream_with_usage(client):
    stream = client.chat.completions.create(model="llm", messages=[{"role": "user", "content": "Hi!"}], max_tokens=6,
                                            temperature=0, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip() and chunks[-1].usage.completion_tokens <= 6


def test_models_list_names_the_served_model(client):
    assert [m.id for m in client.models.list()] == ["llm"]


def test_a_model_is_retrieved_by_its_id(client):
    assert client.models.retrieve("llm").id == "llm"
    with pytest.raises(openai.NotFoundError, match="model 'gpt-4o' does not exist"):
        client.models.retrieve("gpt-4o")


def test_unknown_model_is_a_404(client):
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.completions.create(model="gpt-4", prompt="hi", max_tokens=2)


def test_bad_parameter_is_a_400(client):
    with pytest.raises(openai.BadRequestError, match="temperature must be >= 0"):
        client.completions.create(model="llm", prompt="hi", max_tokens=2, temperature=-1)


def test_completions_logprobs_whole_and_streamed(client):
    args = dict(model="llm", prompt="The capital of Italy is", max_tokens=6, temperature=0, logprobs=3)
    whole = client.completions.create(**args).choices[0].logprobs
    assert len(whole.tokens) == len(whole.token_logprobs) == len(whole.top_logprobs) == 6
    # greedy: each token is its step's most likely, so it heads its alternatives
    assert all(max(top, key=top.get) == tok and len(top) == 3 for tok, top in zip(whole.tokens, whole.top_logprobs))
    streamed = [c.choices[0].logprobs for c in client.completions.create(**args, stream=True) if c.choices]
    assert [t for lp in streamed for t in lp.tokens] == whole.tokens
    assert [v for lp in streamed for v in lp.token_logprobs] == pytest.approx(whole.token_logprobs, abs=1e-4)


def test_chat_logprobs_whole_and_streamed(client):
    args = dict(model="llm", messages=[{"role": "user", "content": "Name a color."}], max_tokens=5, temperature=0,
                logprobs=True, top_logprobs=2)
    whole = client.chat.completions.create(**args).choices[0].logprobs.content
    assert len(whole) == 5 and all(len(t.top_logprobs) == 2 and t.logprob <= 0 for t in whole)
    assert all(bytes(t.bytes).decode() == t.token for t in whole if "\ufffd" not in t.token)
    streamed = [t for c in client.chat.completions.create(**args, stream=True) if c.choices and c.choices[0].logprobs
                for t in c.choices[0].logprobs.content]
    assert [t.token for t in streamed] == [t.token for t in whole]


def test_n_completions_whole_and_streamed(client):
    args = dict(model="llm", prompt="My favourite fruit is", max_tokens=6, temperature=1.0, seed=5, n=2)
    whole = client.completions.create(**args)
    assert sorted(c.index for c in whole.choices) == [0, 1] and whole.usage.completion_tokens <= 12
    streamed: dict[int, str] = {}
    for chunk in client.completions.create(**args, stream=True):
        for c in chunk.choices:
            streamed[c.index] = streamed.get(c.index, "") + c.text
    assert streamed == {c.index: c.text for c in whole.choices}


def test_chat_n_completions(client):
    r = client.chat.completions.create(model="llm", messages=[{"role": "user", "content": "Name a fruit."}], max_tokens=5,
                                       temperature=1.0, seed=2, n=3)
    assert [c.index for c in r.choices] == [0, 1, 2] and all(c.message.role == "assistant" for c in r.choices)


# The population is bounded: unbounded, a small model may repeat a digit until max_tokens (seen
# under the forced avx2 profile), and the grammar enforces the bound as it does the rest.
CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                         "population": {"type": "integer", "minimum": 0, "maximum": 100_000_000}},
        "required": ["city", "population"], "additionalProperties": False}


def test_chat_json_schema_whole_and_streamed(client):
    args = dict(model="llm", messages=[{"role": "user", "content": "Name a big city and its population."}],
                max_tokens=48, temperature=0,
                response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": CITY, "strict": True}})
    whole = client.chat.completions.create(**args).choices[0]
    jsonschema.validate(json.loads(whole.message.content), CITY)
    assert whole.finish_reason == "stop"
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(**args, stream=True)
                       if c.choices)
    assert streamed == whole.message.content


def test_completions_json_object(client):
    # a prompt the model answers briefly ('{"name":"John"}'): where it lists fields, a near tie
    # between closing and going on decides whether 48 tokens end the object
    r = client.completions.create(model="llm", prompt="A JSON object with a person's name:", max_tokens=64,
                                  temperature=0, extra_body={"response_format": {"type": "json_object"}})
    assert r.choices[0].finish_reason == "stop", r.choices[0].text
    assert isinstance(json.loads(r.choices[0].text), dict)


def test_an_invalid_schema_is_a_400(client):
    bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/$defs/missing"}}}
    with pytest.raises(openai.BadRequestError, match="invalid JSON schema"):
        client.chat.completions.create(model="llm", messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                       response_format=bad)
