"""Projection weights in oneDNN's blocked layout, for CPU calls with several rows.

With a handful of rows aten's `mm` on the plain [N, K] weight is slow: its GEMM setup is sized
for many rows, and on AVX2 bf16 has no GEMM kernel at all. oneDNN's linear on a copy packed once
at load (`torch.ops.mkldnn._reorder_linear_weight`) is faster at every row count measured
(docs/benchmarks.md, "Engine choices"). The copy is in bf16 where oneDNN has bf16 kernels, in
float32 elsewhere (handler.engine.platform.choose_path decides; oneDNN's own bf16 check raises on
AVX2). The cost is a second copy of every projection weight (twice the bytes of bf16 weights for
a float32 copy).

The packed tensor has oneDNN's opaque layout, which Dynamo cannot guard on or serialize, so it
stays out of the graphs: `packed_linear(x, weight)` is an opaque op that takes the plain weight
(a graph input like any parameter) and finds its packed copy by the weight's storage address.
An entry lives exactly as long as the plain weight object, which keeps the address from being
reused while the entry exists. The op is registered with the low-level Library API, a CPU
kernel and a fake: `torch.library.custom_op`'s wrapper measured ~100 us a call inside compiled
graphs here (121 calls a decode step), this one ~15 us.
"""
from __future__ import annotations

import weakref

import torch
from torch import Tensor

PACK_ROWS = 16  # the row count oneDNN picks its blocking for; measured fast from 1 to 128 rows

# weight.data_ptr() -> (its shape, packed copy); the copy's dtype is the compute dtype
_packed: dict[int, tuple[torch.Size, Tensor]] = {}


def pack(weight: Tensor, dtype: torch.dtype) -> None:
    """Make packed_linear(x, weight) use a copy of `weight` (2-D, [N, K]) packed in `dtype`,
    which must be one oneDNN has kernels for on this CPU (the platform decides). The copy is
    taken now: pack after the weights are loaded, and again never (in-place changes to the
    weight later would not reach it)."""
    key = weight.data_ptr()
    if key in _packed:
        return
    with torch.no_grad():
        _packed[key] = weight.shape, torch.ops.mkldnn._reorder_linear_weight(weight.detach().to(dtype), PACK_ROWS)
    weakref.finalize(weight, _packed.pop, key, None)


# Registered with the low-level Library API: a CPU kernel only (inference; no autograd wrapper).
_lib = torch.library.Library("ts_llm", "DEF")
_lib.define("packed_linear(Tensor x, Tensor weight, Tensor? bias=None) -> Tensor")


def _packed_linear_cpu(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    entry = _packed.get(weight.data_ptr())
    if entry is None or entry[0] != weight.shape:  # never packed, or a view of a packed weight starting at its address
        raise RuntimeError(f"packed_linear: weight {tuple(weight.shape)} was never packed (call packed.pack first)")
    packed = entry[1]
    # x: [..., K] -> rows [R, K] in the packed dtype; out [R, N] -> [..., N] in x's dtype
    rows = x.reshape(-1, x.shape[-1]).to(packed.dtype)
    bias = None if bias is None else bias.to(packed.dtype)
    out = torch.ops.mkldnn._linear_pointwise(rows, packed, bias, "none", [], "")
    return out.to(x.dtype).reshape(*x.shape[:-1], weight.shape[0])


_lib.impl("packed_linear", _packed_linear_cpu, "CPU")


@torch.library.register_fake("ts_llm::packed_linear")
def _(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    return x.new_empty(*x.shape[:-1], weight.shape[0])


def packed_linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """F.linear(x, weight, bias) through the packed copy of `weight` (see pack)."""
    return torch.ops.ts_llm.packed_linear(x, weight, bias)
