"""`ts_llm::bf16_linear`: F.linear with a bfloat16 weight [N, K] in its plain layout, computed in
float32 by matvec.c; what compiled graphs call for a single row (decode at batch 1) on CPU.

Inductor's own form of that product (a vectorized reduction per output feature, see
linear.Linear) streams the weights well alone but not between the small ops of a decode step.
This kernel reads each weight row as one stream with four independent sums and prefetches ahead,
and a decode step is faster with it on AVX2 and on AVX-512 (docs/benchmarks.md, "Engine
choices"). Opaque, like the other ts_llm ops; the schema and fake are defined here with the
low-level Library API.

Decode batches (a few rows, one per sequence) take it too where the alternative is oneDNN's float32
copy of the weights (AVX2: no bf16 arithmetic): it reads bf16's bytes once for every row, four rows
per widened weight, and is faster than the copy up to MAX_BATCH rows (beyond, the copy wins). Where
oneDNN has bf16 kernels its packed bf16 copy stays: it is as fast at a few rows, much faster at 16,
and one compiled graph serves every batch size. Prefill chunks (many rows) keep the copy everywhere."""
from __future__ import annotations

import torch
from torch import Tensor

from handler.engine.kernels import build

MAX_BATCH = 32  # decode batches up to this many rows use the kernel (see above)

_lib = torch.library.Library("ts_llm", "FRAGMENT")
_lib.define("bf16_linear(Tensor x, Tensor w, Tensor? bias=None) -> Tensor")


@torch.library.register_fake("ts_llm::bf16_linear")
def _(x: Tensor, w: Tensor, bias: Tensor | None = None) -> Tensor:
    build.load()  # a graph being traced will call the CPU kernel
    return x.new_empty(*x.shape[:-1], w.shape[0])


def bf16_linear(x: Tensor, w: Tensor, bias: Tensor | None = None) -> Tensor:
    """F.linear(x, w, bias) for a CPU bfloat16 `w`, summed in float32 and returned in x's dtype
    (the casts fuse into the neighbouring kernels of a compiled graph)."""
    if not torch.compiler.is_compiling():
        build.load()  # (cached) eager calls
    bias = None if bias is None else bias.float()
    return torch.ops.ts_llm.bf16_linear(x.float(), w, bias).to(x.dtype)
