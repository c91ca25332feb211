"""Which projections prepare_model sends through our bf16 kernel: single rows whenever a bf16 CPU
model is compiled, decode batches too only where the alternative is a float32 copy and the batch
stays within matvec.MAX_BATCH."""
from __future__ import annotations

from handler.engine.checkpoint import open_checkpoint
from handler.engine.compiled.prepare import prepare_model
from handler.engine.config import EngineConfig
from handler.engine.kernels import matvec
from handler.engine.model.linear import Linear


def _routes(checkpoint, **overrides) -> set[tuple[bool, bool]]:
    settings = {"dtype": "bfloat16", "compile": "inductor", "quantization": "none", "max_seq_len": 64, **overrides}
    model = prepare_model(open_checkpoint(checkpoint), EngineConfig(checkpoint, **settings))
    return {(m.matvec, m.matvec_batches) for m in model.modules() if isinstance(m, Linear)}


def test_decode_batches_over_a_float32_copy_take_the_kernel(tiny_checkpoint):
    assert _routes(tiny_checkpoint, packed_weights="float32", max_batch_size=4) == {(True, True)}


def test_unpacked_weights_send_only_single_rows(tiny_checkpoint):
    assert _routes(tiny_checkpoint, packed_weights="off", max_batch_size=4) == {(True, False)}


def test_batches_past_the_kernels_range_keep_the_copy(tiny_checkpoint):
    assert _routes(tiny_checkpoint, packed_weights="float32", max_batch_size=matvec.MAX_BATCH + 1) == {(True, False)}


def test_an_eager_model_keeps_aten(tiny_checkpoint):
    assert _routes(tiny_checkpoint, compile="eager", packed_weights="float32", max_batch_size=4) == {(False, False)}
