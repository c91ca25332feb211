"""`ts_llm::quantized_linear` and `ts_llm::kquant_linear`: F.linear with a QuantizedWeight or a
KQuantWeight, the ops the compiled graphs call.

Opaque to Inductor (like handler.engine.model.packed's op). On CPU its kernel is C++ (handler.engine.kernels:
quantized.c), which takes weights in its own layout (QuantizedWeight.pack()) and
reads the quantized bytes directly at any row count, once per call: integer dot products with x
rounded to int8 per block of 32 (and with `rounds` 2 its rounding error too), each row computed as
a lone row is. Quantized weights get no
oneDNN-packed float copy (a float32 copy of every weight: 6x the int4 bytes). Elsewhere (CUDA) the op
dequantizes and calls F.linear: correct, not fast. The schema and the fake are defined here, with
the low-level Library API (no torch.library.custom_op wrapper: ~100 us a call inside graphs)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from handler.engine.kernels import build
from handler.engine.quant import kquant
from handler.engine.quant.kquant import KQuantWeight
from handler.engine.quant.layout import QuantizedWeight, int4_values

_lib = torch.library.Library("ts_llm", "FRAGMENT")
# rounds: how often the CPU kernels round x to int8 per block (1; 2: its rounding error too); other
# devices dequantize and multiply in x's dtype, more exact than either
_lib.define("quantized_linear(Tensor x, Tensor q, Tensor d, Tensor? m=None, Tensor? bias=None, int rounds=1) -> Tensor")
_lib.define("kquant_linear(Tensor x, Tensor q, Tensor? h, Tensor? sc, Tensor? mn, Tensor d, Tensor? dmin, "
            "Tensor? bias=None, int rounds=1) -> Tensor")

Stored = QuantizedWeight | KQuantWeight


def dequantize(w: Stored) -> Tensor:
    """The float32 weight [N, K] (the reference the kernels and tests are held to): d * q (+ m),
    or d * (q - 8), computed as GGUF's own dequantization does; k-quants: kquant.dequantize."""
    if isinstance(w, KQuantWeight):
        return kquant.dequantize(w)
    w = w.unpack()
    n, k = w.shape
    q = w.q.float() if w.bits == 8 else int4_values(w.q, n, k).float() - (8 if w.centred else 0)
    q = q.view(n, w.d.shape[1], -1)  # [N, groups, G]
    out = q * w.d.float()[..., None]
    if w.m is not None:
        out = out + w.m.float()[..., None]
    return out.view(n, k)


def _dequantizing(x: Tensor, q: Tensor, d: Tensor, m: Tensor | None = None, bias: Tensor | None = None,
                  rounds: int = 1) -> Tensor:
    return F.linear(x, dequantize(QuantizedWeight(q, d, m)).to(x.dtype), bias)


def _kquant_dequantizing(x: Tensor, q: Tensor, h: Tensor | None, sc: Tensor | None, mn: Tensor | None, d: Tensor,
                         dmin: Tensor | None, bias: Tensor | None = None, rounds: int = 1) -> Tensor:
    return F.linear(x, kquant.dequantize(_kquant(q, h, sc, mn, d, dmin)).to(x.dtype), bias)


def _kquant(q: Tensor, h: Tensor | None, sc: Tensor | None, mn: Tensor | None, d: Tensor,
            dmin: Tensor | None) -> KQuantWeight:
    bits = 4 if h is None else 5 if h.shape[-1] == 32 else 6
    return KQuantWeight(bits, q, d, dmin, sc, mn, h)


_lib.impl("quantized_linear", _dequantizing, "CUDA")
_lib.impl("kquant_linear", _kquant_dequantizing, "CUDA")


@torch.library.register_fake("ts_llm::quantized_linear")
def _(x: Tensor, q: Tensor, d: Tensor, m: Tensor | None = None, bias: Tensor | None = None, rounds: int = 1) -> Tensor:
    if x.device.type == "cpu":
        build.load()  # a graph being traced will call the CPU kernel
    return x.new_empty(*x.shape[:-1], QuantizedWeight(q, d, m).shape[0])


@torch.library.register_fake("ts_llm::kquant_linear")
def _(x: Tensor, q: Tensor, h: Tensor | None, sc: Tensor | None, mn: Tensor | None, d: Tensor, dmin: Tensor | None,
      bias: Tensor | None = None, rounds: int = 1) -> Tensor:
    if x.device.type == "cpu":
        build.load()
    return x.new_empty(*x.shape[:-1], q.shape[0] * 8)


def quantized_linear(x: Tensor, w: Stored, bias: Tensor | None = None, rounds: int = 1) -> Tensor:
    """F.linear(x, dequantize(w), bias), computed from the quantized bytes in float32: x is cast
    here, where a compiled graph fuses the casts into the neighbouring kernels."""
    if x.device.type == "cpu" and not torch.compiler.is_compiling():
        build.load()  # (cached) eager calls; tracing loads it in the fake, model loading in apply
    bias = None if bias is None else bias.float()  # the CPU kernels add a float32 bias
    if isinstance(w, KQuantWeight):
        y = torch.ops.ts_llm.kquant_linear(x.float(), w.q, w.h, w.sc, w.mn, w.d, w.dmin, bias, rounds)
    else:
        y = torch.ops.ts_llm.quantized_linear(x.float(), w.q, w.d, w.m, bias, rounds)
    return y.to(x.dtype)

