"""REST: the native API, plain and streamed, against a real TorchServe."""
from __future__ import annotations

import json

import pytest
import requests

pytestmark = pytest.mark.slow


def post(server, body, path="predictions/llm", **kw):
    return requests.post(f"{server.inference_url}/{path}", json=body, headers=server.headers(), timeout=120, **kw)


def test_plain_prompt_returns_text_reason_and_usage(server):
    r = post(server, {"prompt": "The three primary colors are", "max_new_tokens": 12})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["text"].strip() and body["finish_reason"] in ("length", "stop")
    assert body["usage"]["completion_tokens"] <= 12 and body["usage"]["prompt_tokens"] > 3


def test_greedy_is_deterministic(server):
    a = post(server, {"prompt": "Once upon a time", "max_new_tokens": 10}).json()["text"]
    b = post(server, {"prompt": "Once upon a time", "max_new_tokens": 10}).json()["text"]
    assert a == b


def test_stream_chunks_join_to_the_plain_answer(server):
    body = {"prompt": "A list of fruits: apple,", "max_new_tokens": 12}
    plain = post(server, body).json()
    r = post(server, {**body, "stream": True}, stream=True)
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/x-ndjson")
    lines = [json.loads(line) for line in r.iter_lines() if line]
    assert len(lines) > 2, "tokens arrive as separate chunks"
    assert "".join(p["text"] for p in lines) == plain["text"]
    assert lines[-1]["finish_reason"] == plain["finish_reason"]


def test_chat_messages_use_the_chat_template(server):
    r = post(server, {"messages": [{"role": "user", "content": "Say hello."}], "max_new_tokens": 12})
    assert r.status_code == 200 and r.json()["text"].strip()


def test_stop_string_ends_generation(server):
    plain = post(server, {"prompt": "Count: 1, 2, 3,", "max_new_tokens": 12}).json()["text"]
    stop = plain.strip()[:1]
    r = post(server, {"prompt": "Count: 1, 2, 3,", "max_new_tokens": 12, "stop": [stop]}).json()
    assert r["finish_reason"] == "stop" and stop not in r["text"]


def test_token_auth_is_on(server):
    r = requests.post(f"{server.inference_url}/predictions/llm", json={"prompt": "hi"}, timeout=30)
    assert r.status_code in (400, 401), "a request without the inference key must be refused"


def test_the_frontend_logs_no_line_per_decode_step_and_each_line_once(server):
    """log4j2.xml (config.properties' vmargs): TorchServe's own configuration writes ~9 lines a
    decode step into ts_log.log, on the cores the engine runs on."""
    log = server.workdir / "logs" / "ts_log.log"
    before = log.stat().st_size
    r = post(server, {"prompt": "Once upon a time", "max_new_tokens": 16, "ignore_eos": True, "stream": True}, stream=True)
    assert r.status_code == 200 and len([line for line in r.iter_lines() if line]) > 2
    with log.open() as f:
        f.seek(before)
        lines = f.read().splitlines()
    assert not [line for line in lines if "Backend response time" in line or "Flushing req.cmd" in line]
    assert not [line for line in lines if "[DEBUG]" in line]
    assert len(lines) == len(set(lines)), "a line written twice"
