"""The custom LLM metrics reach TorchServe's Prometheus endpoint."""
from __future__ import annotations

import re
import time

import pytest
import requests

pytestmark = pytest.mark.slow

EXPECTED = ["ts_llm_time_to_first_token_seconds_bucket", "ts_llm_e2e_request_latency_seconds_count",
            "ts_llm_generation_tokens_total", "ts_llm_prompt_tokens_total", "ts_llm_requests_running",
            "ts_llm_request_success_total", "ts_llm_compile_seconds"]


def test_llm_metrics_are_exported(server):
    requests.post(f"{server.inference_url}/predictions/llm", json={"prompt": "Metrics test", "max_new_tokens": 4},
                  headers=server.headers(), timeout=120).raise_for_status()
    deadline = time.monotonic() + 30  # backend metrics reach the frontend through its log reader
    while time.monotonic() < deadline:
        text = requests.get(f"{server.metrics_url}/metrics", timeout=10).text
        missing = [name for name in EXPECTED if name not in text]
        if not missing:
            break
        time.sleep(0.5)
    assert not missing, f"missing metrics: {missing}"
    assert 'ModelName="llm"' in text
    # the fixture waited for compiled steps: the mode gauge says so, one series per mode
    modes = {mode: float(value) for mode, value in re.findall(r'^ts_llm_engine_mode\{[^}]*mode="(\w+)"[^}]*\} (\S+)$', text, re.MULTILINE)}
    assert modes == {"eager": 0, "loading": 0, "compiling": 0, "compiled": 1}, modes
