"""`ts_llm::decode_attention`: a decode step's attention on CPU (attention.c), on the kernels'
threads (pool.c); what the model's Attention.decode calls there, eager and compiled.

Written out in torch (model/attention.py, still what other devices run), Inductor fused it into
reductions that a compiled graph runs on torch's threads: one under `threading: pool`, so at long
contexts one core read every cached key and value. Here the positions are cut into blocks the pool's
threads claim, each block's softmax is partial (its max, its sum, its weighted values) and the
blocks are merged in order: a row's sums do not depend on the batch or the threads. Opaque, like the
other ts_llm ops; the schema and fake are defined here with the low-level Library API."""
from __future__ import annotations

import torch
from torch import Tensor

from handler.engine.kernels import build

_lib = torch.library.Library("ts_llm", "FRAGMENT")
_lib.define("decode_attention(Tensor q, Tensor k, Tensor v, Tensor visible, float scale) -> Tensor")


@torch.library.register_fake("ts_llm::decode_attention")
def _(q: Tensor, k: Tensor, v: Tensor, visible: Tensor, scale: float) -> Tensor:
    build.load()  # a graph being traced will call the CPU kernel
    return q.new_empty(q.shape, dtype=torch.float32)


def decode_attention(q: Tensor, keys: Tensor, values: Tensor, visible: Tensor, scale: float) -> Tensor:
    """model/attention.py's decode_attention for CPU tensors: q [B, H, 1, D]; keys, values [B, KV, S, D]
    (bfloat16 or float32, the KV cache's strides); visible [B, S] bool. Returns [B, H, 1, D] in
    values' dtype, computed in float32."""
    if not torch.compiler.is_compiling():
        build.load()  # (cached) eager calls
    b, h, _, d = q.shape
    out = torch.ops.ts_llm.decode_attention(q.reshape(b, h, d).float(), keys, values, visible, scale)
    return out.view(b, h, 1, d).to(values.dtype)
