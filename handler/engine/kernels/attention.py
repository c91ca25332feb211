"""`ts_llm::attention`: attention on CPU (attention.c), on the kernels' threads (pool.c); what the
model's Attention calls there in decode and in prefill, eager and compiled.

Under `threading: pool` a compiled graph's own ops run on torch's one thread, so attention written in
torch (Inductor's reductions in decode, SDPA in prefill) read every cached key and value on one core.
Here the positions are cut into blocks the pool's threads claim, each block's softmax is partial (its
max, its sum, its weighted values) and the blocks are merged in order: a query's sums do not depend on
the batch, the chunk or the threads, so a position prefilled and the same position decoded get the
same bits. Opaque, like the other ts_llm ops; the schema and fake are defined here with the low-level
Library API."""
from __future__ import annotations

import torch
from torch import Tensor

from handler.engine.kernels import build

_lib = torch.library.Library("ts_llm", "FRAGMENT")
_lib.define("attention(Tensor q, Tensor k, Tensor v, Tensor pages, Tensor visible, float scale) -> Tensor")


@torch.library.register_fake("ts_llm::attention")
def _(q: Tensor, k: Tensor, v: Tensor, pages: Tensor, visible: Tensor, scale: float) -> Tensor:
    build.load()  # a graph being traced will call the CPU kernel
    b, h, t, d = q.shape
    return torch.empty_strided((b, h, t, d), (t * h * d, d, h * d, 1), dtype=torch.float32, device=q.device)


def attention(q: Tensor, keys: Tensor, values: Tensor, pages: Tensor, visible: Tensor, scale: float) -> Tensor:
    """Attention for CPU tensors: q [B, H, T, D] (T new queries per sequence); keys, values [P, KV, L, D]
    (bfloat16 or float32, the KV cache's pages of L positions); pages [B, N] int64, which page holds each
    run of L positions of sequence b (N * L >= S); visible [B, T, S] bool, which positions query t of
    sequence b sees; scores times `scale`. Returns [B, H, T, D] in values' dtype, computed in float32."""
    if not torch.compiler.is_compiling():
        build.load()  # (cached) eager calls
    # the op makes q contiguous itself: asked here, a graph with an unbacked batch would have to
    # guard on the batch's size
    out = torch.ops.ts_llm.attention(q.float(), keys, values, pages, visible, scale)
    return out.to(values.dtype)
