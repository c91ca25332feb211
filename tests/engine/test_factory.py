"""Engine assembly: a compile process started early is stopped when the model fails to load.

The steps' own choices (eager, compile failures) are in compiled/test_steps.py; the compiled
routes (AOT compile, load, background load) in compiled/test_aot.py.
"""
from __future__ import annotations

import subprocess
import sys

import pytest

from handler.engine import factory
from handler.engine.compiled import artifact_lookup
from handler.engine.compiled.artifacts import ArtifactPlaces
from handler.engine.config import EngineConfig
from handler.engine.factory import build_engine


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
