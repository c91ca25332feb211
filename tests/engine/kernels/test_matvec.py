"""ts_llm::bf16_linear against x @ w.float().T: one row and several (tiles of four and the rows
past them), weight counts past a block of eight, widths with and without a
tail past the vector loop, leading dimensions, bias, and the checks that keep bad tensors out of C."""
from __future__ import annotations

import pytest
import torch

from handler.engine.kernels.matvec import bf16_linear


def _check(y: torch.Tensor, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> None:
    ref = x.double() @ w.double().T
    if bias is not None:
        ref = ref + bias.double()
    # float32 sums in another order than the reference's
    bound = (x.double().abs() @ w.double().abs().T) * 1e-5 + 1e-6
    err = (y.double() - ref).abs()
    assert (err <= bound).all(), f"max error {err.max():.3g}"


@pytest.mark.parametrize("n,k", [(8, 64), (40, 320), (27, 100), (3, 7), (960, 576)])
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 7, 16])
def test_matches_the_float32_product(n, k, rows):
    torch.manual_seed(n * k + rows)
    x, w = torch.randn(rows, k), (torch.randn(n, k) * 0.05).bfloat16()
    _check(bf16_linear(x, w), x, w)


def test_adds_the_bias():
    torch.manual_seed(0)
    x, w, bias = torch.randn(1, 96), torch.randn(16, 96).bfloat16(), torch.randn(16).bfloat16()
    _check(bf16_linear(x, w, bias), x, w, bias)


def test_keeps_leading_dimensions_and_the_input_dtype():
    x, w = torch.randn(2, 1, 64).bfloat16(), torch.randn(8, 64).bfloat16()
    y = bf16_linear(x, w)
    assert y.shape == (2, 1, 8) and y.dtype == torch.bfloat16
    assert torch.equal(y, bf16_linear(x.float().reshape(2, 64), w).reshape(2, 1, 8).bfloat16())


def test_reads_a_non_contiguous_input():
    x, w = torch.randn(64, 3).T, torch.randn(8, 64).bfloat16()  # [3, 64], strided
    _check(bf16_linear(x, w), x, w)


def test_refuses_a_float32_weight():
    with pytest.raises(RuntimeError, match="bf16_linear: w must be contiguous bfloat16"):
        torch.ops.ts_llm.bf16_linear(torch.randn(1, 64), torch.randn(8, 64), None)


def test_refuses_a_weight_of_another_width():
    with pytest.raises(RuntimeError, match=r"bf16_linear: w must be contiguous bfloat16 \[N, 64\]"):
        torch.ops.ts_llm.bf16_linear(torch.randn(1, 64), torch.randn(8, 32).bfloat16(), None)
