"""k-quants and 5-bit blocks: decoded from GGUF bytes to exactly the gguf package's values, packed
for kquant.c and back, and ts_llm::kquant_linear against x @ dequantize(w).T on every form."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, quants

from handler.engine.quant import kquant, ops
from handler.engine.quant.gguf_file import read_directory, read_rows
from handler.engine.quant.kquant import FORMATS, KQuantWeight
from handler.engine.quant.layout import QuantizationError

SCALE_FIELDS = {"Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,), "Q5_0": (0,), "Q5_1": (0, 2)}


def _blocks(kind: str, n: int, k: int, seed: int = 0) -> torch.Tensor:
    """Random GGUF bytes of an [n, k] tensor (every bit pattern of the quantized fields), with
    finite float16 scales."""
    size, per = FORMATS[kind]
    g = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, 256, (n, k // per, size), dtype=torch.uint8, generator=g)
    for at in SCALE_FIELDS[kind]:
        scale = (torch.rand(n, k // per, generator=g) * 0.02 - (0.005 if at else 0)).to(torch.float16)
        raw[..., at:at + 2] = scale.view(torch.uint8).view(n, k // per, 2)
    return raw.view(n, -1)


def _reference(kind: str, raw: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(quants.dequantize(raw.numpy(), GGMLQuantizationType[kind]).astype(np.float32))


@pytest.mark.parametrize("kind", list(FORMATS))
def test_decoded_values_equal_the_gguf_package(kind):
    raw = _blocks(kind, 16, 512)
    w = kquant.from_blocks(kind, raw)
    assert torch.equal(kquant.dequantize(w), _reference(kind, raw))


@pytest.mark.parametrize("kind", list(FORMATS))
def test_pack_and_unpack_keep_every_value(kind):
    w = kquant.from_blocks(kind, _blocks(kind, 16, 512, seed=1))
    packed = w.pack()
    assert packed.packed and packed.shape == w.shape
    assert torch.equal(kquant.dequantize(packed), kquant.dequantize(w))
    restored = packed.unpack()
    assert all(torch.equal(a, b) for a, b in zip(restored.tensors().values(), w.tensors().values()) if a is not None)


def test_rows_select_whole_rows_with_their_scales():
    w = kquant.from_blocks("Q4_K", _blocks("Q4_K", 16, 256, seed=2))
    order = torch.arange(15, -1, -1)
    assert torch.equal(kquant.dequantize(w.rows(order)), kquant.dequantize(w)[order])


def _check(y: torch.Tensor, x: torch.Tensor, w: KQuantWeight, rounds: int = 1) -> None:
    ref_w = ops.dequantize(w).double()
    rows = x.double().reshape(-1, ref_w.shape[1])
    ref = rows @ ref_w.T
    # x rounded to int8 per block of 32 (error <= 1/254 of the block's largest |x|; rounds 2: that
    # error rounded too, to 1/254 of its own); float32 sums
    block_max = rows.abs().view(rows.shape[0], -1, 32).amax(-1).repeat_interleave(32, -1)
    bound = (block_max @ ref_w.abs().T) / 254 ** rounds + (rows.abs() @ ref_w.abs().T) * 1e-5 + 1e-5
    err = (y.double().reshape(ref.shape) - ref).abs()
    assert (err <= bound).all(), f"max error {err.max():.3g}, bound there {bound.flatten()[err.argmax()]:.3g}"


@pytest.mark.parametrize("kind", list(FORMATS))
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 9])
def test_kernel_matches_dequantized_product(kind, rows):
    w = kquant.from_blocks(kind, _blocks(kind, 24, 512, seed=3)).pack()
    x = torch.randn(rows, 512, generator=torch.Generator().manual_seed(rows))
    _check(ops.quantized_linear(x, w), x, w)


@pytest.mark.parametrize("kind", list(FORMATS))
@pytest.mark.parametrize("rows", [1, 5])
def test_two_rounds_leave_only_the_error_of_the_error(kind, rows):
    w = kquant.from_blocks(kind, _blocks(kind, 24, 512, seed=3)).pack()
    x = torch.randn(rows, 512, generator=torch.Generator().manual_seed(rows))
    y = ops.quantized_linear(x, w, rounds=2)
    _check(y, x, w, rounds=2)
    assert not torch.equal(y, ops.quantized_linear(x, w))


@pytest.mark.parametrize("kind", list(FORMATS))
@pytest.mark.parametrize("rounds", [1, 2])
def test_a_row_gets_the_same_result_in_any_batch(kind, rounds):
    # 24 weight rows: 3 row groups, where 512-bit VNNI takes two together (a batch of 7) and the
    # third alone, as a lone row takes all three
    w = kquant.from_blocks(kind, _blocks(kind, 24, 256, seed=4)).pack()
    x = torch.randn(7, 256, generator=torch.Generator().manual_seed(5))
    alone = torch.cat([ops.quantized_linear(x[i:i + 1], w, rounds=rounds) for i in range(7)])
    assert torch.equal(ops.quantized_linear(x, w, rounds=rounds), alone)


def test_bias_and_leading_dims_and_dtype_kept():
    w = kquant.from_blocks("Q6_K", _blocks("Q6_K", 16, 256, seed=6)).pack()
    x = torch.randn(2, 3, 256, dtype=torch.bfloat16)
    bias = torch.randn(16, dtype=torch.bfloat16)
    y = ops.quantized_linear(x, w, bias)
    assert y.shape == (2, 3, 16) and y.dtype == torch.bfloat16
    ref = (ops.quantized_linear(x.float().reshape(6, 256), w) + bias.float()).reshape(2, 3, 16)
    torch.testing.assert_close(y.float(), ref, atol=1e-2, rtol=1e-2)  # bf16 output rounding


def test_fused_parts_of_one_format_concatenate_and_of_two_do_not():
    a = kquant.from_blocks("Q4_K", _blocks("Q4_K", 8, 256, seed=7))
    b = kquant.from_blocks("Q4_K", _blocks("Q4_K", 16, 256, seed=8))
    fused = kquant.cat_rows([a, b])
    assert torch.equal(kquant.dequantize(fused), torch.cat([kquant.dequantize(a), kquant.dequantize(b)]))
    assert not kquant.same_format(a, kquant.from_blocks("Q6_K", _blocks("Q6_K", 8, 256)))


REAL_BLOCKS = Path(__file__).resolve().parents[2] / "fixtures" / "gguf_blocks.gguf"  # bench/gguf_blocks.py


def _real(kind: str) -> torch.Tensor:
    [info] = [t for name, t in read_directory(REAL_BLOCKS).tensors.items() if name.startswith(kind + ".")]
    return read_rows(REAL_BLOCKS, info)


@pytest.mark.parametrize("kind", list(FORMATS))
def test_real_blocks_from_llama_quantize_decode_to_the_gguf_packages_values(kind):
    raw = _real(kind)
    assert torch.equal(kquant.dequantize(kquant.from_blocks(kind, raw)), _reference(kind, raw))


@pytest.mark.parametrize("kind", list(FORMATS))
def test_kernel_on_real_blocks(kind):
    w = kquant.from_blocks(kind, _real(kind)).pack()
    x = torch.randn(3, w.shape[1], generator=torch.Generator().manual_seed(9))
    _check(ops.quantized_linear(x, w), x, w)


@pytest.mark.parametrize("kind", ["Q4_K", "Q6_K", "Q5_0"])
def test_an_embedding_lookup_dequantizes_exactly_the_rows_it_reads(kind):
    from handler.engine.model.linear import QuantizedEmbedding, StoredWeight

    w = kquant.from_blocks(kind, _blocks(kind, 24, 256, seed=10))
    embedding = QuantizedEmbedding(StoredWeight(w.pack()), torch.float32)
    tokens = torch.tensor([[5, 0, 23], [8, 8, 16]])
    assert torch.equal(embedding(tokens), kquant.dequantize(w)[tokens])


def test_a_q5_0_scale_whose_offset_overflows_float16_is_refused():
    raw = _blocks("Q5_0", 8, 32)
    raw.view(8, 22)[0, 0:2] = torch.tensor([60000.0], dtype=torch.float16).view(torch.uint8)  # 16 d is inf in float16
    with pytest.raises(QuantizationError, match="a Q5_0 scale times 16 overflows float16"):
        kquant.from_blocks("Q5_0", raw)


def test_the_op_refuses_a_weight_that_is_not_packed():
    from handler.engine.kernels import build

    build.load()  # the op's CPU kernel
    w = kquant.from_blocks("Q4_K", _blocks("Q4_K", 8, 256))  # row-major, not pack()ed
    with pytest.raises(RuntimeError, match="is not a packed weight"):
        torch.ops.ts_llm.kquant_linear(torch.randn(1, 256), w.q, w.h, w.sc, w.mn, w.d, w.dmin)
