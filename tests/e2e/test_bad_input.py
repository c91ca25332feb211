"""Bad input gets a 4xx that says what to fix, the worker stays up, and good requests batched with
bad ones still succeed."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

pytestmark = pytest.mark.slow

BAD = [
    (b'{"prompt": "unterminated', "application/json", 400, "not valid JSON"),
    (b'{"prompt": "\xff\xfe"}', "application/octet-stream", 400, "not valid UTF-8"),
    (b'{"prompt": 42}', "application/json", 400, "`prompt` must be a string"),
    (b'{"prompt": "hi", "max_new_tokens": "ten"}', "application/json", 400, "`max_new_tokens` must be an integer"),
    (b'{"prompt": "hi", "colour": "red"}', "application/json", 400, "unknown field(s) 'colour'"),
    (b'{"prompt": ""}', "application/json", 400, "`prompt` is empty"),
    (('{"prompt": "' + "word " * 4096 + '"}').encode(), "application/json", 400, "exceed the context"),
    (b'{"prompt": "hi", "max_new_tokens": 100000}', "application/json", 400, "max_new_tokens must be between 1 and"),
    (b'{"prompt": "hi", "temperature": -1}', "application/json", 400, "temperature must be >= 0"),
]


def send(server, data: bytes, content_type: str, path: str = "predictions/llm"):
    headers = {**server.headers(), "Content-Type": content_type}
    return requests.post(f"{server.inference_url}/{path}", data=data, headers=headers, timeout=120)


@pytest.mark.parametrize("data,ctype,status,message", BAD, ids=[b[3] for b in BAD])
def test_bad_input_gets_a_4xx_that_says_what_to_fix(server, data, ctype, status, message):
    r = send(server, data, ctype)
    assert r.status_code == status, r.text
    assert message in r.json()["error"]["message"]


def test_unknown_model_name_is_404(server):
    r = send(server, b'{"prompt": "hi"}', "application/json", path="predictions/no-such-model")
    assert r.status_code == 404


def test_unknown_route_is_404(server):
    r = send(server, b'{"prompt": "hi"}', "application/json", path="predictions/llm/1.0/v1/embeddings")
    assert r.status_code == 404 and "unknown route" in r.json()["error"]["message"]


def test_concurrent_good_and_bad_requests(server):
    good = (b'{"prompt": "The weather today is", "max_new_tokens": 8}', "application/json", 200, None)
    jobs = [good, *BAD[:6], good, good, *BAD[6:], good]
    with ThreadPoolExecutor(len(jobs)) as pool:
        results = list(pool.map(lambda j: send(server, j[0], j[1]), jobs))
    for (_, _, status, message), r in zip(jobs, results):
        assert r.status_code == status, r.text
        if message:
            assert message in r.json()["error"]["message"]
        else:
            assert r.json()["usage"]["completion_tokens"] >= 1
    assert server.ready_workers("llm") == 1, "the worker stays up"
