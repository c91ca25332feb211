"""bench/peer.py's ratios (pure arithmetic), the order its servers take turns in and its --handler-set
reading, its warm-up loop; the load client's reading of OpenAI server-sent events."""
from __future__ import annotations

import pytest

from bench import load, peer


def runs(*levels: tuple[int, float, float, float]) -> dict:
    """(concurrency, tok/s, TTFT p50, gap p99) per level."""
    return {"runs": [{"concurrency": c, "output_tokens_per_s": tps, "ttft_p50_s": ttft, "itl_p99_s": itl, "errors": 0}
                     for c, tps, ttft, itl in levels]}


def llamacpp(fastest: dict, **formats: dict) -> dict:
    return {"formats": formats, "fastest": fastest}


def test_ratios_are_taken_against_the_fastest_type_at_each_level() -> None:
    pairs = {"int4": {"ours": runs((1, 100, 0.05, 0.012), (16, 400, 0.2, 0.05)),
                      "llama.cpp": llamacpp({"1": "Q4_0", "16": "Q4_K_M"},
                                            Q4_0=runs((1, 200, 0.04, 0.008), (16, 300, 0.1, 0.03)),
                                            Q4_K_M=runs((1, 150, 0.04, 0.010), (16, 500, 0.4, 0.04)))}}
    out = peer.ratios(pairs, [1, 16])
    assert out["ratio_best4_c1"] == pytest.approx(0.5)  # against Q4_0's 200
    assert out["ratio_best4_c16"] == pytest.approx(0.8)  # against Q4_K_M's 500
    assert out["ttft_p50_ratio_c16"] == pytest.approx(0.5)  # the Q4_K_M c16 run's 0.4 s
    assert out["itl_p99_ratio_c1"] == pytest.approx(1.5)  # the Q4_0 c1 run's 8 ms
    assert pairs["int4"]["ratio_by_concurrency"]["16"]["tokens_per_s"] == pytest.approx(0.8)


def test_missing_sides_are_null() -> None:
    pairs = {"int4": {"llama.cpp": llamacpp({"1": "Q4_0"}, Q4_0=runs((1, 100, 0.1, 0.01)))},
             "bf16": {"ours": {"error": "config refused", "runs": []},
                      "llama.cpp": llamacpp({"1": "BF16"}, BF16=runs((1, 90, 0.1, 0.01)))}}
    out = peer.ratios(pairs, [1, 16])
    assert all(out[f"ratio_best{w}_c{c}"] is None for c in (1, 16) for w in (4, 8, 16))
    assert out["ttft_p50_ratio_c16"] is None and out["itl_p99_ratio_c1"] is None


def test_the_fastest_type_at_each_level_is_named() -> None:
    formats = {"Q4_0": runs((1, 200, 0.1, 0.01), (16, 300, 0.1, 0.01)), "Q4_1": runs((1, 100, 0.1, 0.01), (16, 350, 0.1, 0.01))}
    assert peer.fastest(formats, [1, 16, 64]) == {"1": "Q4_0", "16": "Q4_1", "64": None}


def test_server_sent_events_content_usage_and_done() -> None:
    text = b'data: {"choices": [{"index": 0, "text": "Hi", "finish_reason": null}]}'
    empty = b'data: {"choices": [{"index": 0, "text": "", "finish_reason": "length"}]}'
    usage = b'data: {"choices": [], "usage": {"completion_tokens": 32}}'
    assert load._event(text) == ({"choices": [{"index": 0, "text": "Hi", "finish_reason": None}]}, True)
    assert load._event(empty)[1] is False
    assert load._event(usage) == ({"choices": [], "usage": {"completion_tokens": 32}}, False)
    assert load._event(b"data: [DONE]") == (None, False)
    assert load._event(b'{"text": "", "finish_reason": "length"}')[1] is True  # native NDJSON: every line


def test_handler_settings_read_their_values_as_yaml() -> None:
    assert peer.handler_settings(["continuous_call_ms=0", "prefix_caching=false"]) == {
        "continuous_call_ms": 0, "prefix_caching": False}
    assert peer.handler_setting(["continuous_call_ms=40"], "continuous_call_ms") == 40


def test_a_handler_setting_without_a_value_says_what_it_wants() -> None:
    with pytest.raises(SystemExit, match="--handler-set wants KEY=VALUE, got 'continuous_call_ms'"):
        peer.handler_settings(["continuous_call_ms"])


def test_servers_take_turns_each_round_in_reversed_order_every_other_round() -> None:
    keys = [("ours", "int4"), ("llama.cpp", "Q4_0"), ("llama.cpp", "Q4_1")]
    order = peer.turns(keys, [1, 16], [32, 64], rounds=2)
    assert order[:6] == [(1, 32, keys[0]), (1, 32, keys[1]), (1, 32, keys[2]),
                         (1, 32, keys[2]), (1, 32, keys[1]), (1, 32, keys[0])]
    assert [(c, n) for c, n, _ in order[6:]] == [(16, 64)] * 6


def test_pooled_rounds_count_only_their_own_time() -> None:
    def round_(start: float) -> list[load.Record]:  # 2 requests of 10 tokens over 1 s, starting at `start`
        return [load.Record(i, start, first=start + 0.1, end=start + 1.0, status=200, completion_tokens=10,
                            chunks=[start + 0.1, start + 0.5]) for i in range(2)]

    summary = peer.pooled([round_(0.0), round_(100.0)])  # a 99 s gap between the rounds: other servers' turns
    assert summary["rounds"] == 2 and summary["requests"] == 4
    assert summary["output_tokens_per_s"] == pytest.approx(20.0)  # 40 tokens over 2 s, not over 101
    assert summary["itl_p50_s"] == pytest.approx(0.4)


def test_warm_up_sends_until_its_time_has_passed() -> None:
    now, sends = [0.0], []

    def send() -> None:
        sends.append(now[0])
        now[0] += 25.0  # each send takes 25 s of the clock

    assert peer.warm_up(send, 60, clock=lambda: now[0]) == 3 * peer.WARMUP_BATCH
    assert sends == [0.0, 25.0, 50.0]


def test_warm_up_sends_once_even_without_time() -> None:
    sends = []
    assert peer.warm_up(lambda: sends.append(1), 0, clock=lambda: 0.0) == peer.WARMUP_BATCH
    assert sends == [1]
