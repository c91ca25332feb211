"""asyncCommunication mode against a real TorchServe: the worker's engine loop streams, queues
beyond its slots, refuses bad input alone, and answers OpenAI clients."""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

pytestmark = pytest.mark.slow

# Of different token counts, so a reply's usage says whose it is.
PROMPTS = ["Hi", "Once upon a time", "The three primary colors of light are",
           "A list of fruits, in alphabetical order: apple, banana,"]


def post(server, body, path="predictions/llm", **kw):
    return requests.post(f"{server.inference_url}/{path}", json=body, headers=server.headers(), timeout=120, **kw)


def streamed_text(server, body) -> tuple[str, list[dict]]:
    r = post(server, {**body, "stream": True}, stream=True)
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/x-ndjson")
    lines = [json.loads(line) for line in r.iter_lines() if line]
    return "".join(p["text"] for p in lines), lines


def test_stream_chunks_join_to_the_plain_answer(async_server):
    body = {"prompt": "A list of fruits: apple,", "max_new_tokens": 12, "ignore_eos": True}
    plain = post(async_server, body).json()
    text, lines = streamed_text(async_server, body)
    assert len(lines) > 2, "tokens arrive as separate chunks"
    assert text == plain["text"] and lines[-1]["finish_reason"] == plain["finish_reason"] == "length"


def test_more_clients_than_slots_all_get_their_own_answers(async_server):
    # 8 slots (conftest), 20 concurrent requests, half streamed: the rest queue in the worker.
    # (Greedy text may differ from a prompt's answer alone: batched rows round differently.)
    def usage(prompt: str, stream: bool) -> tuple[int, int]:
        body = {"prompt": prompt, "max_new_tokens": 10, "ignore_eos": True}
        last = streamed_text(async_server, body)[1][-1] if stream else post(async_server, body).json()
        return last["usage"]["prompt_tokens"], last["usage"]["completion_tokens"]

    alone = {p: usage(p, False) for p in PROMPTS}
    assert len({prompt_tokens for prompt_tokens, _ in alone.values()}) == len(PROMPTS)
    jobs = [(PROMPTS[i % len(PROMPTS)], i % 2 == 1) for i in range(20)]
    with ThreadPoolExecutor(len(jobs)) as pool:
        got = list(pool.map(lambda job: usage(*job), jobs))
    assert got == [alone[prompt] for prompt, _ in jobs]


def test_a_bad_request_gets_a_400_while_others_stream(async_server):
    with ThreadPoolExecutor(3) as pool:
        good = [pool.submit(streamed_text, async_server, {"prompt": p, "max_new_tokens": 8}) for p in PROMPTS[:2]]
        bad = post(async_server, {"prompt": "hi", "temperature": -1})
        texts = [f.result()[0] for f in good]
    assert bad.status_code == 400 and "temperature" in bad.json()["error"]["message"]
    assert all(texts)


def test_openai_client_streams_chat(async_server):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"{async_server.inference_url}/predictions/llm/1.0/v1",
                           api_key=async_server.token(), max_retries=0)
    stream = client.chat.completions.create(model="llm", messages=[{"role": "user", "content": "Say hello."}],
                                            max_tokens=8, stream=True)
    pieces = [c.choices[0].delta.content or "" for c in stream if c.choices]
    assert len(pieces) > 1 and "".join(pieces).strip()


def test_openai_client_lists_the_model(async_server):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"{async_server.inference_url}/predictions/llm/1.0/v1",
                           api_key=async_server.token(), max_retries=0)
    assert [m.id for m in client.models.list()] == ["llm"]
