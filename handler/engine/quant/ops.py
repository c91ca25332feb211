"""`ts_llm::quantized_linear`: F.linear with a QuantizedWeight, the op the compiled graphs call.

Opaque to Inductor (like handler.engine.packed's op): on CPU it calls kernels.c, which reads the
quantized bytes directly; with several rows and a oneDNN-packed float copy of the same weight
(packed_weights, for prefill) it uses that copy from PACKED_MIN_ROWS rows up, where oneDNN's GEMM
is faster than dequantizing. Elsewhere (CUDA) it dequantizes and calls F.linear: correct, not fast.
Registered with the low-level Library API (a kernel per device and a fake), which costs ~15 us a
call inside compiled graphs where torch.library.custom_op's wrapper measured ~100 us."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from handler.engine import packed
from handler.engine.quant import kernel
from handler.engine.quant.layout import BLOCK, QuantizedWeight

PACKED_MIN_ROWS = 64
_kernel = kernel.quantized_linear

_lib = torch.library.Library("ts_llm", "FRAGMENT")
_lib.define("quantized_linear(Tensor x, Tensor q, Tensor d, Tensor? m=None, Tensor? bias=None) -> Tensor")


def dequantize(w: QuantizedWeight) -> Tensor:
    """The float32 weight [N, K] (the reference the kernels and tests are held to): d * q (+ m),
    computed as GGUF's own dequantization does."""
    n, k = w.shape
    if w.bits == 8:
        q = w.q.float()
    else:  # [N, K/32, 16] bytes -> [N, K/32, 32] values: low nibbles first, then high
        blocks = w.q.view(n, k // BLOCK, BLOCK // 2)
        q = torch.cat([blocks & 0x0F, blocks >> 4], dim=-1).float()
    q = q.view(n, w.d.shape[1], -1)  # [N, groups, G]
    out = q * w.d.float()[..., None]
    if w.m is not None:
        out = out + w.m.float()[..., None]
    return out.view(n, k)


def _cpu(x: Tensor, q: Tensor, d: Tensor, m: Tensor | None = None, bias: Tensor | None = None) -> Tensor:
    # Called 121 times a decode step (default model): every microsecond here is ~1% of a step,
    # so no dataclass, no property, no copy when x is already float32 and contiguous.
    n, k = q.shape[0], x.shape[-1]
    rows = x.reshape(-1, k)
    if rows.shape[0] >= PACKED_MIN_ROWS and packed.has_copy(q):
        return packed.packed_linear(x, q, bias)
    if rows.dtype != torch.float32 or not rows.is_contiguous():
        rows = rows.float().contiguous()
    y = torch.empty(rows.shape[0], n, dtype=torch.float32)
    if rows.shape[0]:
        _kernel()(8 if q.dtype == torch.int8 else 4, rows.data_ptr(), q.data_ptr(), d.data_ptr(),
                  None if m is None else m.data_ptr(), y.data_ptr(), rows.shape[0], n, k, k // d.shape[1],
                  torch.get_num_threads())
    if bias is not None:
        y += bias.float()
    return y.to(x.dtype).view(*x.shape[:-1], n)


def _dequantizing(x: Tensor, q: Tensor, d: Tensor, m: Tensor | None = None, bias: Tensor | None = None) -> Tensor:
    return F.linear(x, dequantize(QuantizedWeight(q, d, m)).to(x.dtype), bias)


_lib.impl("quantized_linear", _cpu, "CPU")
_lib.impl("quantized_linear", _dequantizing, "CUDA")


@torch.library.register_fake("ts_llm::quantized_linear")
def _(x: Tensor, q: Tensor, d: Tensor, m: Tensor | None = None, bias: Tensor | None = None) -> Tensor:
    return x.new_empty(*x.shape[:-1], q.shape[0])


def quantized_linear(x: Tensor, w: QuantizedWeight, bias: Tensor | None = None) -> Tensor:
    """F.linear(x, dequantize(w), bias), computed from the quantized bytes in float32: x is cast
    here, where a compiled graph fuses the casts into the neighbouring kernels."""
    return torch.ops.ts_llm.quantized_linear(x.float(), w.q, w.d, w.m, bias).to(x.dtype)
