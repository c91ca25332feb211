"""`ts_llm::quantized_linear`: F.linear with a QuantizedWeight, the op the compiled graphs call.

Opaque to Inductor (like handler.engine.packed's op). On CPU its kernel is C++ (handler.engine.kernels:
quantized.c), which takes weights in its own layout (QuantizedWeight.pack()) and
reads the quantized bytes directly at any row count, once per call: integer dot products with x
rounded to int8 per block of 32, each row computed as a lone row is. Quantized weights get no
oneDNN-packed float copy (a float32 copy of every weight: 6x the int4 bytes). Elsewhere (CUDA) the op
dequantizes and calls F.linear: correct, not fast. The schema and the fake are defined here, with
the low-level Library API (no torch.library.custom_op wrapper: ~100 us a call inside graphs)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from handler.engine.kernels import build
from handler.engine.quant.layout import QuantizedWeight, int4_values

_lib = torch.library.Library("ts_llm", "FRAGMENT")
_lib.define("quantized_linear(Tensor x, Tensor q, Tensor d, Tensor? m=None, Tensor? bias=None) -> Tensor")


def dequantize(w: QuantizedWeight) -> Tensor:
    """The float32 weight [N, K] (the reference the kernels and tests are held to): d * q (+ m),
    or d * (q - 8), computed as GGUF's own dequantization does."""
    w = w.unpack()
    n, k = w.shape
    q = w.q.float() if w.bits == 8 else int4_values(w.q, n, k).float() - (8 if w.centred else 0)
    q = q.view(n, w.d.shape[1], -1)  # [N, groups, G]
    out = q * w.d.float()[..., None]
    if w.m is not None:
        out = out + w.m.float()[..., None]
    return out.view(n, k)


def _dequantizing(x: Tensor, q: Tensor, d: Tensor, m: Tensor | None = None, bias: Tensor | None = None) -> Tensor:
    return F.linear(x, dequantize(QuantizedWeight(q, d, m)).to(x.dtype), bias)


_lib.impl("quantized_linear", _dequantizing, "CUDA")


@torch.library.register_fake("ts_llm::quantized_linear")
def _(x: Tensor, q: Tensor, d: Tensor, m: Tensor | None = None, bias: Tensor | None = None) -> Tensor:
    if x.device.type == "cpu":
        build.load()  # a graph being traced will call the CPU kernel
    return x.new_empty(*x.shape[:-1], QuantizedWeight(q, d, m).shape[0])


def quantized_linear(x: Tensor, w: QuantizedWeight, bias: Tensor | None = None) -> Tensor:
    """F.linear(x, dequantize(w), bias), computed from the quantized bytes in float32: x is cast
    here, where a compiled graph fuses the casts into the neighbouring kernels."""
    if x.device.type == "cpu" and not torch.compiler.is_compiling():
        build.load()  # (cached) eager calls; tracing loads it in the fake, model loading in apply
    bias = None if bias is None else bias.float()  # the CPU kernel adds a float32 bias
    return torch.ops.ts_llm.quantized_linear(x.float(), w.q, w.d, w.m, bias).to(x.dtype)

