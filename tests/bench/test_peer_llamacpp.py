"""Which llama.cpp build bench/peer.py asks for on a CPU: native, native less AMX (where its AMX
path crashes), or AVX2 flags for the forced avx2 profile; and what converting a checkpoint needs."""
from __future__ import annotations

import pytest

from bench import peer_llamacpp as llamacpp
from handler.engine import cpu_profiles, platform

AMX_FEATURES = frozenset({"avx2", "avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl", "avx512_bf16",
                          "amx_tile", "amx_bf16", "amx_int8"})


def _on(monkeypatch, profile: str, forced: bool = False) -> None:
    plat = platform.Platform("x86_64", AMX_FEATURES, cpu_profiles.BY_NAME[profile], forced)
    monkeypatch.setattr(platform, "detect", lambda: plat)


def test_the_build_less_amx_is_native_with_the_tiles_turned_off(monkeypatch):
    _on(monkeypatch, "avx512_amx")
    name, flags = llamacpp.build_profile(without_amx=True)
    assert name == "avx512_amx-no-amx" and "-DGGML_NATIVE=ON" in flags
    assert f"-DCMAKE_CXX_FLAGS={llamacpp.NO_AMX}" in flags and "-mno-amx-int8" in llamacpp.NO_AMX
    assert llamacpp.build_profile() == ("avx512_amx", ["-DGGML_NATIVE=ON"])


def test_a_build_less_amx_is_refused_where_the_profile_has_no_tiles(monkeypatch):
    _on(monkeypatch, "avx512_bf16", forced=True)
    with pytest.raises(llamacpp.LlamaCppError, match="a build without AMX is for the avx512_amx profile"):
        llamacpp.build_profile(without_amx=True)


def test_converting_a_checkpoint_without_sentencepiece_names_the_bench_extra(monkeypatch, tmp_path):
    # llama.cpp's converter imports it: say so before running it, not after its traceback
    monkeypatch.setattr(llamacpp, "cache_root", lambda: tmp_path)
    monkeypatch.setattr(llamacpp.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(llamacpp.LlamaCppError, match=r"install the bench extra"):
        llamacpp.checkpoint_ggufs({}, tmp_path / "llama-1b-random", ["Q4_0"])
    assert not (tmp_path / "gguf").exists()
