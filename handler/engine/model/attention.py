"""Attention's parts that know no model: the KV cache's pages and one
decode step's attention written out in torch (what devices without the CPU kernel run:
kernels/attention.py). Shapes as in transformer.py: B sequences, H query heads, K key/value heads, S cached
positions, D head dim."""
from __future__ import annotations

import torch
from torch import Tensor, nn

PAGE = 16  # positions per KV page: the prefix cache's block, so a shared full block is a shared page


class KVPages(nn.Module):
    """The KV cache as pages of PAGE positions, shared by every sequence: a page table row per
    sequence (an input of each step, made by handler.engine.kv.pages) says which page holds its
    positions [j * PAGE, (j + 1) * PAGE). The last page is scratch: a row's unassigned entries
    point there, so padding writes land where nothing is read."""

    k: Tensor  # buffers, registered in __init__
    v: Tensor

    def __init__(self, pages: int, n_kv_heads: int, head_dim: int, dtype: torch.dtype):
        super().__init__()
        shape = (pages + 1, n_kv_heads, PAGE, head_dim)  # [P + scratch, K, PAGE, D]
        self.register_buffer("k", torch.zeros(shape, dtype=dtype), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype), persistent=False)

    def write(self, pages: Tensor, positions: Tensor, k: Tensor, v: Tensor) -> None:
        # pages: [B, N]; positions: [B, T]; k, v: [B, K, T, D], row b at its positions of sequence b
        page = pages.gather(1, positions // PAGE)  # [B, T]
        self.k[page, :, positions % PAGE] = k.transpose(1, 2)  # indexed as [B, T, K, D]
        self.v[page, :, positions % PAGE] = v.transpose(1, 2)

    def copy_page(self, src: int, dst: int) -> None:
        self.k[dst] = self.k[src]
        self.v[dst] = self.v[src]

    def window(self, pages: Tensor, kv_len: int) -> tuple[Tensor, Tensor]:
        """Keys and values [B, K, kv_len, D] of each row's first kv_len positions, gathered: what
        devices without the CPU kernel (which reads the pages in place) attend to."""
        b, heads, dim = pages.shape[0], self.k.shape[1], self.k.shape[3]
        rows = pages[:, :-(-kv_len // PAGE)]  # [B, n]
        # [B, n, K, PAGE, D] -> [B, K, n * PAGE, D], then the window
        keys, values = (cache[rows].transpose(1, 2).reshape(b, heads, -1, dim)[:, :, :kv_len] for cache in (self.k, self.v))
        return keys, values


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
