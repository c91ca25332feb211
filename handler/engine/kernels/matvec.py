"""`ts_llm::bf16_linear`: F.linear with a bfloat16 weight [N, K] in its plain layout, computed in
float32 by matvec.c; what compiled graphs call for a single row (decode at batch 1) on CPU.

Inductor's own form of that product (a vectorized reduction per output feature, see
linear.Linear) streams the weights well alone (~24 GB/s here) but not between the small ops of a
decode step: chained with them, 121 projections took 19.9 ms against 11.4 ms side by side (AVX2
profile, 2 threads). This kernel reads each weight row as one stream with four independent sums
and prefetches ahead: a default-model decode step took 12.8-13.0 ms instead of 20.3-20.5 (forced
AVX2) and 13.5-15.2 instead of 17.2-17.7 (AVX-512 + AMX; docs/benchmarks.md). Opaque, like the
other ts_llm ops; the schema and fake are defined here with the low-level Library API.

Decode batches (a few rows, one per sequence) take it too where the alternative is oneDNN's float32
copy of the weights (AVX2: no bf16 arithmetic): it reads bf16's bytes once for every row, four rows
per widened weight; all 211 projections at 4 rows took 14.8 ms against the copy's 40.0, at 16 rows
43.3 against 59.4, at 32 81.7 against 79.1 (`python -m bench.paths --cpu-profile avx2`, 2 threads): hence
MAX_BATCH. Where oneDNN has bf16 kernels its packed bf16 copy stays: on AMX it took 14.6-14.8 ms at
2-4 rows against the kernel's 12.0-13.7 but 15.2 against 37.7 at 16, and one compiled graph serves
every batch size. Prefill chunks (many rows) keep the copy everywhere."""
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
