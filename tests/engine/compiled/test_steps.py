"""Step choices that need no compiling: eager steps, compile failures.

The compiled routes themselves (AOT compile, load, background load) are in test_aot.py; the
early lookup's process, stopped when the model fails to load, in tests/engine/test_factory.py.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from handler.engine.compiled import aot
from handler.engine.compiled.errors import CompileError
from handler.engine.compiled.steps import build_steps
from handler.engine.config import EngineConfig
from tests.support.tiny_model import tiny_transformer

NO_CHECKPOINT = Path("never-read")


@pytest.fixture
def model():
    return tiny_transformer(pages=4, max_seq_len=32)


@pytest.fixture
def failing_compile(monkeypatch):
    def fail(model, cfg):
        raise RuntimeError("inductor broke\nlong detail")

    monkeypatch.setattr(aot, "compile_steps", fail)


def config(**fields) -> EngineConfig:
    return EngineConfig(NO_CHECKPOINT, dtype="float32", packed_weights="off", max_batch_size=2, max_seq_len=32, **fields)


def test_compile_eager_serves_the_model_steps(model):
    steps = build_steps(model, config(compile="eager"))
    assert steps.mode == "eager" and not steps.eager_fallback and steps.serving == "eager"
    assert steps.prefill == model.prefill and steps.decode == model.decode


def test_a_failed_compile_raises_compile_error_with_the_reason(model, failing_compile):
    with pytest.raises(CompileError, match=r"failed \(RuntimeError: inductor broke\); fix it or set on_compile_error"):
        build_steps(model, config())


def test_a_failed_compile_serves_eager_when_allowed_and_reports_the_reason(model, failing_compile):
    reasons = []
    steps = build_steps(model, config(on_compile_error="eager"), on_fallback=reasons.append)
    assert steps.mode == "eager" and steps.eager_fallback and steps.serving == "eager"
    assert reasons == ["RuntimeError: inductor broke"]
