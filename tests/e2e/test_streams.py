"""Streams in the default continuous mode against a real TorchServe: a token a chunk, and a client
that goes away frees its slot."""
from __future__ import annotations

import json
import re
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


def test_a_client_that_goes_away_is_cancelled_and_frees_its_slot(server):
    cancelled = metric(server, "ts_llm_request_failure_total", 'reason="cancelled"')
    with stream(server, 64) as r:
        next(r.iter_lines())  # the first token arrived: the request is running
    deadline = time.monotonic() + 30  # backend metrics reach the frontend through its log reader
    while time.monotonic() < deadline:
        if metric(server, "ts_llm_request_failure_total", 'reason="cancelled"') > cancelled:
            break
        time.sleep(0.2)
    assert metric(server, "ts_llm_request_failure_total", 'reason="cancelled"') == cancelled + 1
    assert metric(server, "ts_llm_requests_running") == 0
