"""bench/scale.py's arithmetic: the targets issue 59 names, as ours over llama.cpp, and the 16k
context counted as served only when ours answered a prompt that long."""
from __future__ import annotations

from bench.scale import parse_args, targets


def _side(ttft: dict[int, float], status: int = 200, prompt_tokens: int = 15990, rss: int = 2 << 30) -> dict:
    return {"short_c1": {"ttft_p50_s": 0.05},
            "long": {str(n): {"ttft_s": t, "status": status, "prompt_tokens": prompt_tokens} for n, t in ttft.items()},
            "mixed": {"streams": {"itl_p50_s": 0.04, "itl_p99_s": 0.2}},
            "loaded": {"rss_bytes": rss}, "after": {"rss_bytes": rss}}


def test_targets_are_ours_over_llama_cpp():
    args = parse_args([])
    ours = _side({1024: 2.0, 4096: 9.0, 16000: 50.0})
    ours["mixed"]["streams"]["itl_p99_s"] = 0.1
    got = targets({"ours": ours, "llama.cpp": _side({1024: 4.0, 4096: 10.0, 16000: 40.0}, rss=1 << 30)}, args)
    assert got["ttft_1k_ratio_1b"] == 0.5 and got["ttft_4k_ratio_1b"] == 0.9 and got["ttft_16k_ratio_1b"] == 1.25
    assert got["mixed_itl_p99_ratio"] == 0.5 and got["rss_ratio_1b"] == 2.0 and got["ttft_short_ratio_c1_1b"] == 1.0
    assert got["context_16k_served"] is True


def test_a_long_prompt_refused_is_no_context_served():
    args = parse_args([])
    ours = _side({1024: 2.0, 4096: 9.0, 16000: None}, status=400)
    got = targets({"ours": ours, "llama.cpp": _side({1024: 4.0, 4096: 10.0, 16000: 40.0})}, args)
    assert got["context_16k_served"] is False and got["ttft_16k_ratio_1b"] is None
