"""bench/contention.py's targets (pure arithmetic over its runs): which runs each ratio compares."""
from __future__ import annotations

import pytest

from bench import contention


def side(**conditions: tuple[float, float]) -> dict:
    """condition -> (tok/s, gap p99) at one client."""
    return {"conditions": {name: [{"concurrency": 1, "output_tokens_per_s": tps, "itl_p99_s": itl}]
                           for name, (tps, itl) in conditions.items()}}


def test_each_target_compares_the_runs_the_issue_names() -> None:
    results = {"ours": side(quiet=(100, 0.02), nice19=(95, 0.03), nice0=(40, 0.06)),
               "ours_before": side(quiet=(98, 0.02), nice0=(1, 2.0)),
               "llama.cpp": side(quiet=(120, 0.01), nice0=(20, 0.3))}
    out = contention.targets(results, [1], "")
    assert out["nice19_over_quiet_c1"] == pytest.approx(0.95)  # ours beside nice 19 over ours quiet
    assert out["nice0_ratio_vs_llamacpp_c1"] == pytest.approx(2.0)  # both beside a nice-0 process
    assert out["nice0_itl_p99_ratio_c1"] == pytest.approx(0.2)
    assert out["quiet_over_before_c1"] == pytest.approx(100 / 98)


def test_a_missing_run_is_none_and_the_1b_keys_carry_their_prefix() -> None:
    out = contention.targets({"ours": side(quiet=(100, 0.02))}, [1], "b1_")
    assert out["b1_nice19_over_quiet_c1"] is None and out["b1_quiet_over_before_c1"] is None
