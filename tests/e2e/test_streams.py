"""Streams in the default continuous mode against a real TorchServe: a token a chunk, a client
that goes away is cancelled, and a whole answer held beside a stream holds the stream up not at all."""
from __future__ import annotations

import json
import re
import threading
import time

import pytest
import requests

pytestmark = pytest.mark.slow


def stream(server, max_new_tokens: int) -> requests.Response:
    body = {"prompt": "Count slowly:", "max_new_tokens": max_new_tokens, "stream": True, "ignore_eos": True}
    return requests.post(f"{server.inference_url}/predictions/llm", json=body, headers=server.headers(), timeout=120,
                         stream=True)


def metric(server, name: str, label: str = "") -> float:
    text = requests.get(f"{server.metrics_url}/metrics", timeout=10).text
    values = re.findall(rf'^{name}\{{[^}}]*{label}[^}}]*\}} (\S+)$', text, re.MULTILINE)
    return sum(float(v) for v in values)


def test_each_token_comes_in_a_chunk_of_its_own(server):
    r = stream(server, 12)
    chunks = [c for c in r.raw.read_chunked() if c.strip()]
    pieces = [json.loads(line) for c in chunks for line in c.splitlines() if line.strip()]
    assert pieces[-1]["usage"]["completion_tokens"] == 12
    assert len(chunks) == len(pieces) == 12, [len(c.splitlines()) for c in chunks]


def test_a_whole_answer_is_one_response_and_the_stream_beside_it_goes_on_a_token_a_chunk(server):
    whole: list[requests.Response] = []
    body = {"prompt": "Count slowly:", "max_new_tokens": 24, "ignore_eos": True}
    sender = threading.Thread(target=lambda: whole.append(requests.post(
        f"{server.inference_url}/predictions/llm", json=body, headers=server.headers(), timeout=120)))
    sender.start()
    chunks = [c for c in stream(server, 12).raw.read_chunked() if c.strip()]
    sender.join(120)
    [answer] = whole
    assert answer.status_code == 200 and "chunked" not in answer.headers.get("Transfer-Encoding", "")
    assert answer.json()["usage"]["completion_tokens"] == 24
    assert len(chunks) == 12, "the stream beside it got its tokens a chunk each"


def test_a_client_that_goes_away_is_cancelled_within_a_step(server):
    # The frontend drops a closed stream at its next reply and sends the worker no call for it; the
    # worker cancels it at the next call it gets (here: the next request's) and has run no step
    # for it meanwhile beyond the one run ahead.
    before = {name: metric(server, *name) for name in COUNTERS}
    with stream(server, 64) as r:
        next(r.iter_lines())  # its first token arrived: it is running
    requests.post(f"{server.inference_url}/predictions/llm", json={"prompt": "Next", "max_new_tokens": 2},
                  headers=server.headers(), timeout=120).raise_for_status()
    deadline = time.monotonic() + 30  # backend metrics reach the frontend through its log reader
    while time.monotonic() < deadline and metric(server, *CANCELLED) == before[CANCELLED]:
        time.sleep(0.2)
    assert metric(server, *CANCELLED) == before[CANCELLED] + 1
    assert metric(server, *TOKENS) - before[TOKENS] <= 2 + 4  # the next request's 2, the gone one's first few, not 64
    assert metric(server, "ts_llm_requests_running") == 0


CANCELLED = ("ts_llm_request_failure_total", 'reason="cancelled"')
TOKENS = ("ts_llm_generation_tokens_total", "")
COUNTERS = (CANCELLED, TOKENS)
