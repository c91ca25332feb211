"""ts_llm::quantized_linear against x @ dequantize(w).T, on every path of kernels/quantized.c: one row, several
rows (3x4 tiles and edges), the packed layout it reads, and the checks that keep bad tensors out of C."""
from __future__ import annotations

import re

import pytest
import torch

from handler.engine.quant import ops
from handler.engine.quant.layout import QuantizationError, QuantizedWeight, cat_rows
from handler.engine.quant.rtn import quantize_int4, quantize_int8


def _weights(bits: int | str, n: int, k: int, group: int) -> QuantizedWeight:
    """bits 8, 4 (with minimums, as Q4_1) or "4c" (centred, as Q4_0: w = d * (q - 8))."""
    torch.manual_seed(n * k + (bits if bits != "4c" else 5))
    w = torch.randn(n, k) * 0.05
    if bits == 8:
        return quantize_int8(w).pack()
    w = quantize_int4(w, group)
    return (QuantizedWeight(w.q, w.d) if bits == "4c" else w).pack()


def _check(y: torch.Tensor, x: torch.Tensor, w: QuantizedWeight, bias: torch.Tensor | None = None, rounds: int = 1) -> None:
    ref_w = ops.dequantize(w).double()
    ref = x.double().reshape(-1, ref_w.shape[1]) @ ref_w.T
    if bias is not None:
        ref = ref + bias.double()
    rows = x.double().reshape(-1, ref_w.shape[1])
    # x is rounded to int8 per 32-block, each value off by at most 1/254 of its block's largest
    # |x|; with rounds 2 so is that error, to 1/254 of its own (<= 1/254 of x's); sums are float32.
    block_max = rows.abs().view(rows.shape[0], -1, 32).amax(-1).repeat_interleave(32, -1)
    rounding = (block_max @ ref_w.abs().T) / 254 ** rounds
    bound = rounding + (rows.abs() @ ref_w.abs().T) * 1e-5 + 1e-5
    err = (y.double().reshape(ref.shape) - ref).abs()
    assert (err <= bound).all(), f"max error {err.max():.3g}, bound there {bound.flatten()[err.argmax()]:.3g}"


@pytest.mark.parametrize("bits", [8, 4, "4c"])
@pytest.mark.parametrize("n,k", [(40, 320), (64, 96), (8, 576)])
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 16])
def test_matches_dequantized_product(bits, n, k, rows):
    w = _weights(bits, n, k, 32)
    x = torch.randn(rows, k)
    _check(ops.quantized_linear(x, w), x, w)


@pytest.mark.parametrize("bits", [8, 4, "4c"])
@pytest.mark.parametrize("rows", [1, 3, 5, 16])
def test_two_rounds_leave_only_the_error_of_the_error(bits, rows):
    w = _weights(bits, 40, 320, 32)
    x = torch.randn(rows, 320)
    y = ops.quantized_linear(x, w, rounds=2)
    _check(y, x, w, rounds=2)
    assert not torch.equal(y, ops.quantized_linear(x, w))  # the second round is taken


@pytest.mark.parametrize("bits", [4, "4c"])
@pytest.mark.parametrize("group", [64, 96])
def test_int4_groups_wider_than_a_block(group, bits):
    w = _weights(bits, 16, 192, group)
    for rows in (1, 4, 16):
        x = torch.randn(rows, 192)
        _check(ops.quantized_linear(x, w), x, w)


def test_bias_and_leading_dims_and_dtype_kept():
    w = _weights(8, 16, 64, 64)
    x = torch.randn(2, 3, 64, dtype=torch.bfloat16)
    bias = torch.randn(16, dtype=torch.bfloat16)
    y = ops.quantized_linear(x, w, bias)
    assert y.shape == (2, 3, 16) and y.dtype == torch.bfloat16
    ref = (x.float().reshape(6, 64) @ ops.dequantize(w).T + bias.float()).reshape(2, 3, 16)
    torch.testing.assert_close(y.float(), ref, atol=2e-2, rtol=1e-2)  # bf16 output rounding


@pytest.mark.parametrize("bits", [8, 4])
def test_pack_reorders_bytes_and_unpack_restores_them(bits):
    torch.manual_seed(bits)
    w = quantize_int8(torch.randn(16, 64)) if bits == 8 else quantize_int4(torch.randn(16, 64), 32)
    packed = w.pack()
    assert packed.packed and packed.shape == w.shape and packed.q.shape == (2, 2, 32 * bits)
    assert packed.d.shape == (2, w.d.shape[1], 8)
    restored = packed.unpack()
    assert all(torch.equal(a, b) for a, b in zip((restored.q, restored.d), (w.q, w.d)))
    assert bits == 8 or torch.equal(restored.m, w.m)
    assert torch.equal(ops.dequantize(packed), ops.dequantize(w))


def test_int4_packed_bytes_follow_the_kernels_layout():
    """Byte 32 c + 4 r + i of a block: column 8 c + i of row r (low nibble), column 8 c + 4 + i (high)."""
    values = (torch.arange(8 * 32) % 16).view(8, 32).float()
    values[:, 0] = 0
    values[:, 1] = 15  # every row's group spans 0..15: d = 1, m = 0, q = value
    q = quantize_int4(values, 32).pack().q[0, 0]
    for c, r, i in ((0, 0, 0), (1, 3, 2), (3, 7, 3)):
        byte = int(q[32 * c + 4 * r + i])
        assert (byte & 0x0F, byte >> 4) == (int(values[r, 8 * c + i]), int(values[r, 8 * c + 4 + i]))


def test_pack_refuses_a_row_count_not_a_multiple_of_8():
    with pytest.raises(QuantizationError, match="multiple of 8 output features, this one has 12"):
        quantize_int8(torch.randn(12, 64)).pack()


def test_zero_rows():
    w = _weights(4, 8, 64, 32)
    assert ops.quantized_linear(torch.randn(0, 64), w).shape == (0, 8)


@pytest.mark.parametrize("bits", [4, "4c"])
def test_an_all_zero_block_of_x(bits):
    w = _weights(bits, 8, 256, 32)
    x = torch.randn(1, 256)
    x[0, 32:64] = 0
    _check(ops.quantized_linear(x, w), x, w)


def test_compiled_graph_calls_the_op():
    w = _weights(4, 16, 256, 32)

    def f(x):
        return ops.quantized_linear(torch.relu(x), w) * 2

    x = torch.randn(3, 256)
    torch.testing.assert_close(torch.compile(f, fullgraph=True)(x), f(x))


def test_many_rows_read_the_quantized_bytes_too():
    w = _weights(8, 24, 128, 128)
    x = torch.randn(200, 128)
    _check(ops.quantized_linear(x, w), x, w)


@pytest.mark.parametrize("bits", [8, 4, "4c"])
@pytest.mark.parametrize("n,rows", [(64, 7), (64, 37), (40, 21)])
def test_a_row_gets_the_same_result_in_any_batch(bits, n, rows):
    # 37 rows: two full tiles of 16 where the CPU has AMX and one of 5; 40 weight rows: 5 row groups,
    # the last one without a partner
    w = _weights(bits, n, 1536, 32)  # several row-group chunks
    x = torch.randn(rows, 1536)
    for rounds in (1, 2):
        alone = torch.cat([ops.quantized_linear(x[i:i + 1], w, rounds=rounds) for i in range(rows)])
        assert torch.equal(ops.quantized_linear(x, w, rounds=rounds), alone)


@pytest.mark.parametrize("change,message", [
    (lambda x, q, d, m: (x.double(), q, d, m), "x must be float32, got Double"),
    (lambda x, q, d, m: (x, q[:, :1].contiguous(), d, m), "is not a packed weight"),
    (lambda x, q, d, m: (x, q.view(8, -1), d, m), "is not a packed weight"),
    (lambda x, q, d, m: (x, q, d.float(), m), "d must be contiguous float16"),
    (lambda x, q, d, m: (x, q, d, m[:, :1]), "m must be float16 shaped like d, and only int4 has one"),
    (lambda x, q, d, m: (x, q, d, m.float()), "m must be float16 shaped like d"),
])
def test_bad_tensors_are_refused_before_the_kernel_reads_them(change, message):
    w = _weights(4, 8, 64, 32)
    ops.quantized_linear(torch.randn(1, 64), w)  # loads the kernels
    x, q, d, m = change(torch.randn(1, 64), w.q, w.d, w.m)
    with pytest.raises(RuntimeError, match=re.escape(message)):
        torch.ops.ts_llm.quantized_linear(x, q, d, m)


@pytest.mark.parametrize("x,bias,message", [
    (torch.randn(()), None, "x must have a feature dimension"),
    (torch.randn(1, 64), torch.zeros(8, dtype=torch.bfloat16), "bias must be contiguous float32 [N]"),
    (torch.randn(1, 64), torch.zeros(7), "bias must be contiguous float32 [N]"),
])
def test_bad_inputs_and_bias_are_refused(x, bias, message):
    w = _weights(4, 8, 64, 32)
    ops.quantized_linear(torch.randn(1, 64), w)  # loads the kernels
    with pytest.raises(RuntimeError, match=re.escape(message)):
        torch.ops.ts_llm.quantized_linear(x, w.q, w.d, w.m, bias)


def test_centred_int4_fuses_with_minimum_weights_into_the_same_values():
    centred, minimum = _weights("4c", 8, 64, 32).unpack(), _weights(4, 16, 64, 32).unpack()
    fused = cat_rows([centred, minimum])
    assert fused.m is not None
    assert torch.equal(ops.dequantize(fused), torch.cat([ops.dequantize(centred), ops.dequantize(minimum)]))


@pytest.mark.parametrize("bits", [8, 4, "4c"])
def test_an_embedding_lookup_dequantizes_exactly_the_rows_it_reads(bits):
    from handler.engine.model.linear import QuantizedEmbedding, StoredWeight

    w = _weights(bits, 24, 64, 32)
    embedding = QuantizedEmbedding(StoredWeight(w), torch.bfloat16)
    tokens = torch.tensor([3, 23, 0, 9])
    assert torch.equal(embedding(tokens), ops.dequantize(w)[tokens].to(torch.bfloat16))


def test_rounds_other_than_one_or_two_are_refused():
    w = _weights(4, 8, 64, 32)
    with pytest.raises(RuntimeError, match="quantized_linear: rounds must be 1 or 2, got 3"):
        torch.ops.ts_llm.quantized_linear(torch.randn(1, 64), w.q, w.d, w.m, None, 3)
