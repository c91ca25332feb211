"""The cold compile in a process of its own: the worker serves eager steps at once and switches
to the compiled ones once the process has installed a verified artifact."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from handler.cache.check import Verdict
from handler.cache.key import KEY_FILE_NAME
from handler.engine import config, platform
from handler.engine.checkpoint import open_checkpoint
from handler.engine.compiled import artifacts
from handler.engine.compiled.artifacts import ArtifactPlaces
from handler.engine.compiled.cold.in_background import compile_artifact, wait_for_compile
from handler.engine.compiled.errors import CompileError
from handler.engine.config import EngineConfig
from handler.engine.factory import build_engine
from handler.engine.sampling import SamplingParams
from tests.support.generate import generate

PROMPTS = ["The capital of France is", "Hi"]


@pytest.fixture
def cfg(tiny_checkpoint) -> EngineConfig:
    return EngineConfig(tiny_checkpoint, dtype="float32", max_batch_size=2, max_seq_len=64, warm_start="background")


def test_the_config_reaches_the_process_unchanged(cfg):
    assert config.from_json(config.to_json(cfg)) == cfg


def test_a_failed_compile_process_is_a_compile_error():
    process = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(3)"])
    with pytest.raises(CompileError, match=r"exited with code 3"):
        wait_for_compile(process)


# A "worker" that starts a watching "compile process" (sleeping in place of compiling) and exits.
_CHILD = """
import sys, time
from pathlib import Path
from handler.engine.compiled.cold.child import watch_parent
watch_parent(int(sys.argv[1]), poll_s=0.05)
Path(sys.argv[2]).write_text("started")
try:
    time.sleep(60)
finally:
    Path(sys.argv[2]).write_text("cleaned up")
"""
_PARENT = """
import os, subprocess, sys, time
from pathlib import Path
child = subprocess.Popen([sys.executable, "-c", sys.argv[1], str(os.getpid()), sys.argv[2]])
Path(sys.argv[3]).write_text(str(child.pid))
while not Path(sys.argv[2]).exists():
    time.sleep(0.05)
"""


def test_the_process_stops_with_its_worker_and_cleans_up(tmp_path):
    marker, child_pid = tmp_path / "marker", tmp_path / "pid"
    subprocess.run([sys.executable, "-c", _PARENT, _CHILD, str(marker), str(child_pid)], check=True, timeout=60)
    pid = int(child_pid.read_text())
    deadline = time.monotonic() + 20
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(pid), "the compile process outlived its worker"
    assert marker.read_text() == "cleaned up"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # an exited child of the (gone) parent is reaped by init; a zombie still answers kill(0)
    return Path(f"/proc/{pid}/stat").exists() and Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


def test_the_process_refuses_a_key_it_does_not_compute(cfg, tmp_path):
    with pytest.raises(ValueError, match="the worker asked for not-this-key"):
        compile_artifact(cfg, "not-this-key", tmp_path / "aot")
    assert not (tmp_path / "aot").exists()


def answers(engine) -> list[list[int]]:
    ids = [engine.tokenizer.encode(p) for p in PROMPTS]
    return generate(engine, ids, [SamplingParams(max_new_tokens=8, ignore_eos=True)] * len(ids))


@pytest.mark.timeout(600)
def test_a_cold_worker_serves_eager_then_switches_to_what_the_process_installed(cfg, tmp_path, caplog, capfd, monkeypatch):
    # An empty Inductor cache: a kernel the artifact carries but the loading thread keys
    # differently (it once did: torch's config overrides are per thread context) is compiled
    # again at load, and said so, instead of being found from an earlier test.
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    cache_dir = tmp_path / "aot"
    compiled = []
    loaded = build_engine(cfg, places=ArtifactPlaces(cache_dir=cache_dir), on_compiled=compiled.append)
    assert loaded.steps.mode == "aot-compiling" and loaded.steps.serving == "compiling"
    eager_tokens = answers(loaded.engine)  # answered now, while the process compiles
    assert not loaded.steps.background.compiled, "the tiny model answers before its compile ends"
    assert loaded.steps.background.done.wait(540), "the compile process did not finish"
    assert answers(loaded.engine) == eager_tokens
    assert loaded.steps.background.compiled and len(compiled) == 1
    assert "C++ libraries the artifact did not carry" not in caplog.text, "the worker compiled nothing at load"
    key = artifacts.artifact_key(platform.resolve(cfg)[0], artifacts.weights_digest(open_checkpoint(cfg.checkpoint_dir)))
    assert artifacts.check_dir(cache_dir, key).verdict == Verdict.VERIFIED
    assert (cache_dir / KEY_FILE_NAME).exists()
    # Compiled beside it by processes forked with the model it prepared (side_by_side).
    assert "compiling prefill in a process of its own beside this one (forked)" in capfd.readouterr().err
