"""Which route model projections take: single rows of CPU bf16 weights through our kernel once
use_matvec() is called, rows one per sequence too with use_matvec(batches=True) over a float32
copy, everything else as before."""
from __future__ import annotations

import torch

from handler.engine.model.linear import Linear


def _graph_ops(fn, *args) -> str:
    """The code of the graph torch.compile captures for fn(*args)."""
    code: list[str] = []

    def backend(gm, example_inputs):
        code.append(gm.code)
        return gm.forward

    torch.compile(fn, backend=backend, fullgraph=True)(*args)
    return "".join(code)


def test_a_matvec_linear_sends_single_rows_to_the_kernel():
    torch.manual_seed(0)
    linear = Linear(64, 16).bfloat16()
    linear.use_matvec()
    one, several = torch.randn(1, 1, 64).bfloat16(), torch.randn(3, 64).bfloat16()
    with torch.inference_mode():
        assert "ts_llm.bf16_linear" in _graph_ops(linear, one)
        assert "ts_llm.bf16_linear" not in _graph_ops(linear, several)
        assert torch.allclose(linear(one).float(), torch.nn.functional.linear(one, linear.weight, linear.bias).float(),
                              rtol=1e-2, atol=1e-2)


def test_with_batches_rows_one_per_sequence_go_to_the_kernel_too():
    torch.manual_seed(0)
    linear = Linear(64, 16).bfloat16()
    linear.pack(torch.float32)
    linear.use_matvec(batches=True)
    decode, head = torch.randn(4, 1, 64).bfloat16(), torch.randn(4, 64).bfloat16()
    with torch.inference_mode():
        assert "ts_llm.bf16_linear" in _graph_ops(linear, decode)
        assert "ts_llm.bf16_linear" in _graph_ops(linear, head)
        assert torch.allclose(linear(decode).float(), torch.nn.functional.linear(decode, linear.weight, linear.bias).float(),
                              rtol=1e-2, atol=1e-2)


def test_with_batches_a_prefill_chunk_does_not():
    linear = Linear(64, 16).bfloat16()
    linear.pack(torch.float32)
    linear.use_matvec(batches=True)
    with torch.inference_mode():
        assert "ts_llm.bf16_linear" not in _graph_ops(linear, torch.randn(2, 5, 64).bfloat16())


def test_without_batches_a_decode_batch_does_not():
    linear = Linear(64, 16).bfloat16()
    linear.use_matvec()
    with torch.inference_mode():
        assert "ts_llm.bf16_linear" not in _graph_ops(linear, torch.randn(4, 1, 64).bfloat16())


def test_batches_need_a_wider_packed_copy():
    linear = Linear(64, 16).bfloat16()
    linear.use_matvec(batches=True)
    with torch.inference_mode():
        assert "ts_llm.bf16_linear" not in _graph_ops(linear, torch.randn(4, 1, 64).bfloat16())


def test_use_matvec_leaves_float32_weights_to_inductor():
    linear = Linear(64, 16)
    linear.use_matvec()
    assert not linear.matvec
