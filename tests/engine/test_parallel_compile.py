"""Prefill and decode's general graph compiled in processes of their own beside decode's batch-1
graph: one artifact, as if compiled in one process."""
from __future__ import annotations

import dataclasses
import logging

import pytest
import torch

from handler.engine import aot, cpp_cache, parallel_compile
from handler.engine.checkpoint import open_checkpoint
from handler.engine.config import EngineConfig
from handler.engine.prepare import prepare_model

pytestmark = pytest.mark.skipif(parallel_compile.usable_cores() < 2, reason="needs two cores")


@pytest.fixture(scope="module")
def cfg(tiny_checkpoint) -> EngineConfig:
    return EngineConfig(tiny_checkpoint, dtype="float32", packed_weights="off", max_batch_size=4, max_seq_len=64)


@pytest.fixture
def model(cfg):
    return prepare_model(open_checkpoint(cfg.checkpoint_dir), cfg)


def _compile_steps(model, cfg) -> dict:
    model_cache = cpp_cache.inductor_cache_dir()
    with cpp_cache.private_build_dirs() as build_dir:  # as compile_and_install calls it
        return parallel_compile.compile_steps(model, cfg, model_cache, build_dir)


def test_children_compile_prefill_and_decode_general_as_they_would_here(cfg, model, caplog, capfd):
    with caplog.at_level(logging.INFO, logger="handler.engine.parallel_compile"):
        steps = aot.serving_steps(model, _compile_steps(model, cfg))
    assert "compiling prefill in a process of its own" in caplog.text
    assert "compiling decode, general in a process of its own" in caplog.text
    err = capfd.readouterr().err  # the children's own log lines
    assert "compile process (prefill):" in err and "compile process (decode, general):" in err
    assert "compiling graph 2 of 3 (prefill, general" in err and "compiling graph 3 of 3 (decode, general" in err
    assert len(steps.prefill.graphs) == 1 and len(steps.decode.graphs) == 2
    assert [s.batch for s in steps.examples["decode"]][0] == 1  # batch-1 graph first: match() picks it
    here = aot.compile_steps(model, cfg)  # the same graphs compiled in this process
    tokens = torch.tensor([[5, 17, 42, 7, 0], [3, 9, 11, 0, 0]])
    prefill_args = (tokens, torch.arange(2), torch.tensor([0, 0]), torch.tensor([3, 2]), 64)
    assert torch.equal(steps.prefill(*prefill_args), here.prefill(*prefill_args))
    for batch in (1, 3):
        decode_args = (torch.arange(batch) + 4, torch.full((batch,), 5), 64)
        assert steps.decode.match(*decode_args) is steps.decode.graphs[batch > 1]
        assert torch.equal(steps.decode(*decode_args), here.decode(*decode_args))


def test_a_failing_child_is_an_aot_error_naming_it(cfg, model, monkeypatch, tmp_path):
    gone = dataclasses.replace(cfg, checkpoint_dir=tmp_path / "gone")  # the child cannot build the model
    monkeypatch.setattr(aot, "compile_step", lambda *args: (aot.CompiledStep(model, "decode"), []))
    with pytest.raises(aot.AotError, match=r"compiling prefill in a process of its own .* failed with exit code 1"):
        _compile_steps(model, gone)


class CompiledHere(Exception):
    pass


def test_one_core_compiles_in_this_process(cfg, model, monkeypatch, caplog):
    def compile_steps(model, cfg):
        raise CompiledHere

    monkeypatch.setattr(parallel_compile, "usable_cores", lambda: 1)
    monkeypatch.setattr(aot, "compile_steps", compile_steps)
    with caplog.at_level(logging.INFO, logger="handler.engine.parallel_compile"), pytest.raises(CompiledHere):
        _compile_steps(model, cfg)
    assert "process of its own" not in caplog.text
