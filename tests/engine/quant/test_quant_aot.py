"""Quantized projections in the AOT-compiled graphs: compiled, saved, loaded, and the tokens are the
eager quantized model's. The quantization is in the artifact's key."""
from __future__ import annotations

import dataclasses

import pytest

from handler.engine.checkpoint import open_checkpoint
from handler.engine.compiled import artifacts
from handler.engine.compiled.artifacts import ArtifactPlaces
from handler.engine.config import EngineConfig
from handler.engine.factory import build_engine
from handler.engine.sampling import SamplingParams
from tests.support.generate import generate

pytestmark = pytest.mark.slow
PROMPTS = ["The capital of France is", "Hi", "def fibonacci(n):"]


def _greedy(engine) -> list[list[int]]:
    ids = [engine.tokenizer.encode(p) for p in PROMPTS]
    return generate(engine, ids, [SamplingParams(max_new_tokens=10, ignore_eos=True)] * len(ids))


@pytest.fixture(scope="module")
def cfg(tiny_checkpoint) -> EngineConfig:
    return EngineConfig(tiny_checkpoint, dtype="float32", max_batch_size=4, max_seq_len=64, quantization="int4",
                        warm_start="blocking")


def test_compiled_loaded_and_eager_quantized_tokens_agree(cfg, tmp_path):
    places = ArtifactPlaces(cache_dir=tmp_path / "aot")
    cold = build_engine(cfg, places=places)
    assert cold.steps.mode == "aot-compiled"
    compiled = _greedy(cold.engine)
    loaded = build_engine(cfg, places=places)
    assert loaded.steps.mode == "aot-loaded"
    assert _greedy(loaded.engine) == compiled == _greedy(build_engine(dataclasses.replace(cfg, compile="eager")).engine)


def test_quantization_is_in_the_artifact_key(cfg):
    digest = artifacts.weights_digest(open_checkpoint(cfg.checkpoint_dir))
    keys = {q: artifacts.artifact_key(dataclasses.replace(cfg, quantization=q), digest).digest() for q in ("none", "int8", "int4")}
    keys["int4-g64"] = artifacts.artifact_key(dataclasses.replace(cfg, group_size=64), digest).digest()
    assert len(set(keys.values())) == 4
