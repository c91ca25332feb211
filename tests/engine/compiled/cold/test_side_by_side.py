"""Prefill and decode's general graph compiled in processes of their own beside decode's batch-1
graph: one artifact, as if compiled in one process."""
from __future__ import annotations

import dataclasses
import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from handler.engine.checkpoint import open_checkpoint
from handler.engine.compiled import aot, cpp_cache, saved_graphs
from handler.engine.compiled.cold import compile_times, side_by_side
from handler.engine.compiled.prepare import prepare_model
from handler.engine.config import EngineConfig
from handler.engine.kv.pages import own_pages

pytestmark = pytest.mark.skipif(side_by_side.usable_cores() < 2, reason="needs two cores")


@pytest.fixture(scope="module")
def cfg(tiny_checkpoint) -> EngineConfig:
    return EngineConfig(tiny_checkpoint, dtype="float32", packed_weights="off", max_batch_size=4, max_seq_len=64)


@pytest.fixture
def model(cfg):
    return prepare_model(open_checkpoint(cfg.checkpoint_dir), cfg)


def _compile_steps(model, cfg) -> dict:
    model_cache = cpp_cache.inductor_cache_dir()
    with cpp_cache.private_build_dirs() as build_dir:  # as compile_and_install calls it
        return side_by_side.compile_in_parts(model, cfg, model_cache, build_dir)


def test_children_compile_prefill_and_decode_general_as_they_would_here(cfg, model, caplog, capfd):
    with caplog.at_level(logging.INFO, logger="handler.engine.compiled.cold.side_by_side"):
        steps = saved_graphs.serving_steps(model, _compile_steps(model, cfg))
    assert "compiling prefill in a process of its own" in caplog.text
    assert "compiling decode, general in a process of its own" in caplog.text
    assert "compiling graphs side by side: 0 of 3 done" in caplog.text  # with a time estimate
    recorded = json.loads((Path(cpp_cache.inductor_cache_dir()) / compile_times.FILE).read_text())
    assert set(recorded[str(len(model.layers))]) == {"decode, batch 1", "prefill", "decode, general"}  # the next estimate
    err = capfd.readouterr().err  # the children's own log lines
    assert "compile process (prefill):" in err and "compile process (decode, general):" in err
    assert "compiling graph 2 of 3 (prefill, general" in err and "compiling graph 3 of 3 (decode, general" in err
    assert len(steps.prefill.graphs) == 1 and len(steps.decode.graphs) == 2
    assert steps.examples["decode"][0].batch == 1  # batch-1 graph first: match() picks it
    here = aot.compile_steps(model, cfg)  # the same graphs compiled in this process
    tokens = torch.tensor([[5, 17, 42, 7, 0], [3, 9, 11, 0, 0]])
    prefill_args = (tokens, own_pages(2, cfg.max_seq_len), torch.tensor([0, 0]), torch.tensor([3, 2]), 64)
    assert torch.equal(steps.prefill(*prefill_args), here.prefill(*prefill_args))
    for batch in (1, 3):
        decode_args = (torch.arange(batch) + 4, own_pages(batch, cfg.max_seq_len), torch.full((batch,), 5), 64)
        assert steps.decode.match(*decode_args) is steps.decode.graphs[batch > 1]
        assert torch.equal(steps.decode(*decode_args), here.decode(*decode_args))


def test_a_failing_child_is_an_aot_error_naming_it(cfg, model, monkeypatch, tmp_path):
    gone = dataclasses.replace(cfg, checkpoint_dir=tmp_path / "gone")  # the child cannot build the model
    monkeypatch.setattr(aot, "compile_step", lambda *args: (aot.CompiledStep(model, "decode"), []))
    with pytest.raises(aot.AotError, match=r"compiling prefill in a process of its own .* failed with exit code 1"):
        _compile_steps(model, gone)


# A compile process (torch on one thread so far) whose forked prefill helper fails while the
# other helper would compile for ever: the failure names the helper, and the other is stopped.
_FORKING = """
import json, sys, time
from pathlib import Path
import torch
from handler.engine.checkpoint import open_checkpoint
from handler.engine.compiled import aot, cpp_cache
from handler.engine.compiled.cold import side_by_side
from handler.engine.compiled.prepare import prepare_model
from handler.engine.config import EngineConfig

torch.set_num_threads(1)
cfg = EngineConfig(Path(sys.argv[1]), dtype="float32", packed_weights="off", max_batch_size=4, max_seq_len=64)
model = prepare_model(open_checkpoint(cfg.checkpoint_dir), cfg)

def part(model, cfg, part, out):
    if part.step == "prefill":
        while not Path(sys.argv[2]).exists():  # the other helper is running
            time.sleep(0.05)
        raise RuntimeError("no prefill today")
    Path(sys.argv[2] + ".tmp").write_text(str(__import__("os").getpid()))
    Path(sys.argv[2] + ".tmp").rename(sys.argv[2])
    time.sleep(600)

side_by_side._compile_part = part
aot.compile_step = lambda *args: (aot.CompiledStep(model, "decode"), [])
with cpp_cache.private_build_dirs() as build_dir:
    try:
        side_by_side.compile_in_parts(model, cfg, cpp_cache.inductor_cache_dir(), build_dir, fork_threads=2)
    except aot.AotError as err:
        print(json.dumps({"error": str(err), "threads": torch.get_num_threads()}))
"""


@pytest.mark.timeout(120)
def test_a_failing_forked_child_is_an_aot_error_naming_it_and_the_other_is_stopped(tiny_checkpoint, tmp_path):
    pid_file = tmp_path / "pid"
    run = subprocess.run([sys.executable, "-c", _FORKING, str(tiny_checkpoint), str(pid_file)], capture_output=True,
                         text=True, timeout=100)
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert "compiling prefill in a process of its own" in result["error"] and "exit code 1" in result["error"]
    assert "compile process (prefill): ERROR" in run.stderr and "no prefill today" in run.stderr
    assert result["threads"] == 2  # the worker's count once the helpers are forked
    assert not Path(f"/proc/{pid_file.read_text()}").exists(), "the other helper outlived the failure"


class CompiledHere(Exception):
    pass


def test_one_core_compiles_in_this_process(cfg, model, monkeypatch, caplog):
    def compile_steps(model, cfg):
        raise CompiledHere

    monkeypatch.setattr(side_by_side, "usable_cores", lambda: 1)
    monkeypatch.setattr(aot, "compile_steps", compile_steps)
    with caplog.at_level(logging.INFO, logger="handler.engine.compiled.cold.side_by_side"), pytest.raises(CompiledHere):
        _compile_steps(model, cfg)
    assert "process of its own" not in caplog.text
