"""Projection weights in oneDNN's blocked layout, for CPU calls with several rows.

With a handful of rows aten's bf16 `mm` on the plain [N, K] weight is slow here (the weights
stream at ~8-9 GB/s in a 16-row decode step). oneDNN's linear on a copy packed once at load
(`torch.ops.mkldnn._reorder_linear_weight`) is faster. Measured here (2-core AVX512-BF16, the
default model's 30 layers, weights streaming from memory): 1.3x at 1 row, 2.1x at 4, 1.6x at
16, 1.2x at 128 (a prefill); the 49152-row output projection 3.2x at 1 row, 2.1x at 16. The
cost is a second copy of every projection weight in memory.

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

_packed: dict[int, tuple[torch.Size, Tensor]] = {}  # weight.data_ptr() -> (its shape, packed copy)


def available(weight: Tensor) -> bool:
    """oneDNN packing is measured (and used) for bf16 weights on CPU only."""
    return weight.device.type == "cpu" and weight.dtype == torch.bfloat16 and torch.backends.mkldnn.is_available()


def pack(weight: Tensor) -> None:
    """Make packed_linear(x, weight) use a packed copy of `weight` (2-D, [N, K]). The copy is
    taken now: pack after the weights are loaded, and again never (in-place changes to the
    weight later would not reach it)."""
    key = weight.data_ptr()
    if key in _packed:
        return
    with torch.no_grad():
        _packed[key] = weight.shape, torch.ops.mkldnn._reorder_linear_weight(weight.detach(), PACK_ROWS)
    weakref.finalize(weight, _packed.pop, key, None)


# Registered with the low-level Library API: a CPU kernel only (inference; no autograd wrapper).
_lib = torch.library.Library("ts_llm", "DEF")
_lib.define("packed_linear(Tensor x, Tensor weight, Tensor? bias=None) -> Tensor")


def _packed_linear_cpu(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    shape, packed = _packed.get(weight.data_ptr(), (None, None))
    if shape != weight.shape:  # never packed, or a view of a packed weight starting at its address
        raise RuntimeError(f"packed_linear: weight {tuple(weight.shape)} was never packed (call packed.pack first)")
    # x: [..., K] -> rows [R, K]; out [R, N] -> [..., N]
    out = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, x.shape[-1]), packed, bias, "none", [], "")
    return out.reshape(*x.shape[:-1], weight.shape[0])


_lib.impl("packed_linear", _packed_linear_cpu, "CPU")


@torch.library.register_fake("ts_llm::packed_linear")
def _(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    return x.new_empty(*x.shape[:-1], weight.shape[0])


def packed_linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """F.linear(x, weight, bias) through the packed copy of `weight` (see pack)."""
    return torch.ops.ts_llm.packed_linear(x, weight, bias)
