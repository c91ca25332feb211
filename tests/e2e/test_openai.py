"""The OpenAI-style routes, called with the official OpenAI client pointed at TorchServe."""
from __future__ import annotations

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


def test_chat_stream_with_usage(client):
    stream = client.chat.completions.create(model="llm", messages=[{"role": "user", "content": "Hi!"}], max_tokens=6,
                                            temperature=0, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip() and chunks[-1].usage.completion_tokens <= 6


def test_models_list_names_the_served_model(client):
    assert [m.id for m in client.models.list()] == ["llm"]


def test_unknown_model_is_a_404(client):
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.completions.create(model="gpt-4", prompt="hi", max_tokens=2)


def test_bad_parameter_is_a_400(client):
    with pytest.raises(openai.BadRequestError, match="temperature must be >= 0"):
        client.completions.create(model="llm", prompt="hi", max_tokens=2, temperature=-1)
