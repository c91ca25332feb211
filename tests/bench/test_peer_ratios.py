"""bench/peer.py's ratios (pure arithmetic) and its --handler-set reading, and loadgen's reading
of OpenAI server-sent events."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import loadgen  # noqa: E402
import peer  # noqa: E402


def side(*levels: tuple[int, float, float]) -> dict:
    return {"runs": [{"concurrency": c, "output_tokens_per_s": tps, "ttft_p99_s": ttft, "errors": 0} for c, tps, ttft in levels]}


def test_ratios_per_precision_and_the_ttft_ratio_of_ours_best_c16() -> None:
    pairs = {
        "bf16": {"ours": side((1, 50, 0.1), (16, 400, 0.4)), "llama.cpp": side((1, 100, 0.05), (16, 200, 0.8))},
        "int4": {"ours": side((1, 60, 0.1), (16, 500, 0.3)), "llama.cpp": side((1, 120, 0.05), (16, 1000, 0.1))},
        "int8": {"ours": {"error": "config refused", "runs": []}, "llama.cpp": side((1, 110, 0.05), (16, 600, 0.2))},
    }
    out = peer.ratios(pairs, [1, 16])
    assert out["ratio_c1_bf16"] == pytest.approx(0.5)
    assert out["ratio_c16_bf16"] == pytest.approx(2.0)
    assert out["ratio_c1_int4"] == pytest.approx(0.5)
    assert out["ratio_c16_int4"] == pytest.approx(0.5)
    assert out["ratio_c1_int8"] is None and out["ratio_c16_int8"] is None
    assert out["ttft_p99_ratio_c16_precision"] == "int4"  # ours' best c16 throughput
    assert out["ttft_p99_ratio_c16"] == pytest.approx(3.0)
    assert pairs["bf16"]["ratio_by_concurrency"] == {"1": pytest.approx(0.5), "16": pytest.approx(2.0)}


def test_missing_precisions_are_null() -> None:
    out = peer.ratios({"int4": {"llama.cpp": side((1, 100, 0.1))}}, [1, 16])
    assert all(out[f"ratio_c{c}_{p}"] is None for c in (1, 16) for p in ("bf16", "int8", "int4"))
    assert out["ttft_p99_ratio_c16"] is None


def test_server_sent_events_content_usage_and_done() -> None:
    text = b'data: {"choices": [{"index": 0, "text": "Hi", "finish_reason": null}]}'
    empty = b'data: {"choices": [{"index": 0, "text": "", "finish_reason": "length"}]}'
    usage = b'data: {"choices": [], "usage": {"completion_tokens": 32}}'
    assert loadgen._event(text) == ({"choices": [{"index": 0, "text": "Hi", "finish_reason": None}]}, True)
    assert loadgen._event(empty)[1] is False
    assert loadgen._event(usage) == ({"choices": [], "usage": {"completion_tokens": 32}}, False)
    assert loadgen._event(b"data: [DONE]") == (None, False)
    assert loadgen._event(b'{"text": "", "finish_reason": "length"}')[1] is True  # native NDJSON: every line


def test_handler_settings_read_their_values_as_yaml() -> None:
    assert peer.handler_settings(["continuous_call_ms=0", "prefix_caching=false"]) == {
        "continuous_call_ms": 0, "prefix_caching": False}
    assert peer.continuous_call_ms(["continuous_call_ms=40"]) == 40


def test_a_handler_setting_without_a_value_says_what_it_wants() -> None:
    with pytest.raises(SystemExit, match="--handler-set wants KEY=VALUE, got 'continuous_call_ms'"):
        peer.handler_settings(["continuous_call_ms"])
