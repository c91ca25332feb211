"""Attention's parts that know no model: the KV cache's slots and one
decode step's attention written out in torch (what devices without the CPU kernel run:
kernels/attention.py). Shapes as in transformer.py: B sequences, H query heads, K key/value heads, S cached
positions, D head dim."""
from __future__ import annotations

import torch
from torch import Tensor, nn


class KVCache(nn.Module):
    k: Tensor  # buffers, registered in __init__
    v: Tensor

    def __init__(self, slots: int, max_seq: int, n_kv_heads: int, head_dim: int, dtype: torch.dtype):
        super().__init__()
        shape = (slots, n_kv_heads, max_seq, head_dim)
        self.register_buffer("k", torch.zeros(shape, dtype=dtype), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype), persistent=False)

    def write_chunk(self, slot_ids: Tensor, positions: Tensor, k: Tensor, v: Tensor) -> None:
        # slot_ids: [B]; positions: [B, T]; k, v: [B, K, T, D], row b at its positions of slot b
        rows = slot_ids[:, None]
        self.k[rows, :, positions] = k.transpose(1, 2)  # indexed as [B, T, K, D]
        self.v[rows, :, positions] = v.transpose(1, 2)

    def copy_prefix(self, src: int, dst: int, length: int) -> None:
        """Positions 0..length-1 of slot `src` into slot `dst` (a prompt prefilled once for n samples)."""
        self.k[dst, :, :length] = self.k[src, :, :length]
        self.v[dst, :, :length] = self.v[src, :, :length]

    def write_decode(self, input_pos: Tensor, k: Tensor, v: Tensor) -> None:
        # input_pos: [B] (slot b writes at its own position); k, v: [B, K, 1, D]
        rows = torch.arange(k.shape[0], device=k.device)
        self.k[rows, :, input_pos] = k[:, :, 0]
        self.v[rows, :, input_pos] = v[:, :, 0]


def decode_attention(q: Tensor, keys: Tensor, values: Tensor, visible: Tensor, scale: float) -> Tensor:
    """Attention of one new token per sequence. q: [B, H, 1, D]; keys, values: [B, K, S, D];
    visible: [B, S], which positions sequence b sees; scores times `scale`. Returns [B, H, 1, D].
    What devices other than the CPU run (there: kernels/attention.py). Written out: SDPA cost 3-4x
    this on CPU for one masked query row with grouped KV heads. Query heads sharing a KV head
    are one matmul's rows (keys and values read once per KV head); fp32 scores, as eager HF."""
    b, h, _, d = q.shape
    kv_heads = keys.shape[1]
    grouped = q.view(b, kv_heads, h // kv_heads, d)  # [B, K, G, D]: query head i uses KV head i // G
    compiling = torch.compiler.is_compiling()
    if compiling:
        # As reductions Inductor fuses with the mask and softmax (no bmm calls, fp32 sums).
        scores = (grouped[:, :, :, None, :].float() * keys[:, :, None, :, :].float()).sum(-1)
    else:
        scores = torch.matmul(grouped, keys.transpose(-1, -2)).float()
    scores = scores * scale  # [B, K, G, S]
    scores = scores.masked_fill(~visible[:, None, None, :], float("-inf"))
    probs = scores.softmax(dim=-1)
    if compiling:
        out = (probs[..., None] * values[:, :, None, :, :].float()).sum(-2).to(values.dtype)
    else:
        out = torch.matmul(probs.to(values.dtype), values)
    return out.view(b, h, 1, d)
