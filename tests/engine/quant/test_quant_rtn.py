"""Round-to-nearest quantization: errors within half a step, GGUF's nibble order, degenerate rows."""
from __future__ import annotations

import pytest
import torch

from handler.engine.quant.layout import QuantizationError
from handler.engine.quant.ops import dequantize
from handler.engine.quant.rtn import quantize_int4, quantize_int8


def test_int8_is_per_output_channel_within_half_a_step():
    torch.manual_seed(0)
    w = torch.randn(16, 96) * torch.linspace(0.01, 1, 16)[:, None]
    qw = quantize_int8(w)
    assert qw.q.dtype == torch.int8 and qw.d.shape == (16, 1) and qw.m is None
    step = qw.d.float()
    assert ((dequantize(qw) - w).abs() <= step / 2 + step * 1e-3).all()


def test_int4_is_per_group_within_half_a_step():
    torch.manual_seed(1)
    w = torch.randn(8, 128)
    qw = quantize_int4(w, 64)
    assert qw.q.shape == (8, 64) and qw.d.shape == (8, 2) and qw.m.shape == (8, 2)
    step = qw.d.float().repeat_interleave(64, dim=1)
    # the float16 minimum is rounded too: allow its rounding on top of half a step
    assert ((dequantize(qw) - w).abs() <= step / 2 + w.abs().amax() * 2e-3).all()


def test_int4_packs_two_weights_per_byte_in_gguf_order():
    ramp = torch.arange(32, dtype=torch.float32).repeat(1, 1) % 16  # values 0..15, twice
    qw = quantize_int4(ramp, 32)
    # min 0, max 15: d = 1, m = 0, q = w; byte j = w[j] | w[j + 16] << 4
    expected = torch.tensor([j | (j << 4) for j in range(16)], dtype=torch.uint8)
    assert torch.equal(qw.q[0], expected)
    assert torch.equal(dequantize(qw), ramp)


def test_zero_rows_and_constant_int4_groups_are_exact():
    w = torch.zeros(2, 64)
    assert torch.equal(dequantize(quantize_int8(w)), w)
    w[1] = 0.5  # int4: d = 0, the minimum holds the value
    assert torch.equal(dequantize(quantize_int4(w, 32)), w)


@pytest.mark.parametrize("group", [16, 48, 100])
def test_a_group_size_that_does_not_fit_is_refused(group):
    with pytest.raises(QuantizationError, match="group_size"):
        quantize_int4(torch.randn(4, 96), group)
