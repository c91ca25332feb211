"""Engine assembly choices that need no compiling: eager steps, compile failures, the early lookup's process.

The compiled routes themselves (AOT compile, load, background load) are in test_aot.py.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from handler.engine import factory
from handler.engine.compiled import aot, artifact_lookup
from handler.engine.compiled.artifacts import ArtifactPlaces
from handler.engine.compiled.errors import CompileError
from handler.engine.config import EngineConfig
from handler.engine.factory import build_engine, build_steps
from tests.support.tiny_model import tiny_transformer

NO_CHECKPOINT = Path("never-read")


@pytest.fixture
def model():
    return tiny_transformer(slots=2, max_seq_len=32)


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


def test_a_compile_process_started_early_is_stopped_when_the_model_fails_to_load(tiny_checkpoint, tmp_path, monkeypatch):
    started = []

    def start(cfg, key, dest):
        started.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]))
        return started[-1]

    def broken(ckpt, cfg):
        raise OSError("weights unreadable")

    monkeypatch.setattr(artifact_lookup, "start_compile_process", start)
    monkeypatch.setattr(factory, "prepare_model", broken)
    cfg = EngineConfig(tiny_checkpoint, dtype="float32", max_batch_size=2, max_seq_len=32, warm_start="background")
    with pytest.raises(OSError, match="weights unreadable"):
        build_engine(cfg, places=ArtifactPlaces(cache_dir=tmp_path / "aot"))
    assert len(started) == 1 and started[0].wait(10) != 0
