"""A Llama-family decoder (Llama 2/3, Mistral, SmolLM, Qwen2/3, Gemma 3) written for torch.compile.

Every sequence in a batch has its own position and its own row of the KV cache's page table
(handler.engine.kv.pages), so prompts of different lengths share one batch, and the cache's pages
go to whichever sequences need them between two steps.
Shapes: B = sequences in the call, T = tokens per sequence, S = cached positions attended,
H = query heads, K = key/value heads, D = head dim.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from handler.engine.kernels import attention as kernel_attention
from handler.engine.model.args import ModelArgs
from handler.engine.model.attention import KVPages, decode_attention
from handler.engine.model.linear import Linear
from handler.engine.model.rope import apply_rope, rope_frequencies


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, offset: float = 0.0):
        super().__init__()
        self.eps, self.offset = eps, offset
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.offset:  # Gemma: (offset + w) in float32, then cast
            return (xf * (self.offset + self.weight.float())).to(x.dtype)
        return self.weight * xf.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        qkv_out = (args.n_heads + 2 * args.n_kv_heads) * args.head_dim
        # q, k and v fused into one matmul: one weight read per layer instead of three.
        self.wqkv = Linear(args.dim, qkv_out, bias=args.qkv_bias)
        self.wo = Linear(args.n_heads * args.head_dim, args.dim, bias=False)
        if args.qk_norm:
            self.q_norm = RMSNorm(args.head_dim, args.norm_eps, args.norm_offset)
            self.k_norm = RMSNorm(args.head_dim, args.norm_eps, args.norm_offset)
        self.kv_cache: KVPages | None = None

    def _qkv(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        a = self.args
        b, t, _ = x.shape
        q, k, v = self.wqkv(x).split([a.n_heads * a.head_dim, a.n_kv_heads * a.head_dim, a.n_kv_heads * a.head_dim], -1)
        q, k = q.view(b, t, a.n_heads, a.head_dim), k.view(b, t, a.n_kv_heads, a.head_dim)
        if a.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = v.view(b, t, a.n_kv_heads, a.head_dim).transpose(1, 2)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def _out(self, y: Tensor) -> Tensor:
        b, _, t, _ = y.shape
        return self.wo(y.transpose(1, 2).reshape(b, t, -1))

    def prefill(self, x: Tensor, cos: Tensor, sin: Tensor, pages: Tensor, positions: Tensor,
                visible: Tensor) -> Tensor:
        # pages: [B, N], each sequence's page table row; visible: [B, 1, T, S], which of the
        # sequence's first S cached positions each new token sees
        q, k, v = self._qkv(x, cos, sin)
        assert self.kv_cache is not None, "setup_cache first"
        self.kv_cache.write(pages, positions, k, v)
        if q.device.type == "cpu":
            return self._out(kernel_attention.attention(q, self.kv_cache.k, self.kv_cache.v, pages, visible[:, 0], self._scale()))
        keys, values = self.kv_cache.window(pages, visible.shape[-1])  # [B, K, S, D]: cached prefix and this chunk
        y = F.scaled_dot_product_attention(q, keys, values, attn_mask=visible, enable_gqa=True, scale=self.args.attn_scale)
        return self._out(y)

    def decode(self, x: Tensor, cos: Tensor, sin: Tensor, pages: Tensor, input_pos: Tensor, visible: Tensor) -> Tensor:
        # pages: [B, N]; visible: [B, S], which of the sequence's first S cached positions the new token sees
        q, k, v = self._qkv(x, cos, sin)
        assert self.kv_cache is not None, "setup_cache first"
        self.kv_cache.write(pages, input_pos[:, None], k, v)
        if q.device.type == "cpu":
            return self._out(kernel_attention.attention(q, self.kv_cache.k, self.kv_cache.v, pages, visible[:, None], self._scale()))
        keys, values = self.kv_cache.window(pages, visible.shape[-1])  # [B, K, S, D]
        return self._out(decode_attention(q, keys, values, visible, self._scale()))

    def _scale(self) -> float:
        return self.args.head_dim**-0.5 if self.args.attn_scale is None else self.args.attn_scale


class FeedForward(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.hidden, self.gelu = args.intermediate_size, args.gelu_mlp
        self.w13 = Linear(args.dim, 2 * args.intermediate_size, bias=False)  # gate and up, fused
        self.w2 = Linear(args.intermediate_size, args.dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.w13(x).split(self.hidden, dim=-1)
        return self.w2((F.gelu(gate, approximate="tanh") if self.gelu else F.silu(gate)) * up)


class Block(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.attention = Attention(args)
        self.feed_forward = FeedForward(args)
        self.attention_norm = RMSNorm(args.dim, args.norm_eps, args.norm_offset)
        self.ffn_norm = RMSNorm(args.dim, args.norm_eps, args.norm_offset)
        if args.post_norms:
            self.post_attention_norm = RMSNorm(args.dim, args.norm_eps, args.norm_offset)
            self.post_ffn_norm = RMSNorm(args.dim, args.norm_eps, args.norm_offset)
        self.post_norms = args.post_norms

    def _residual(self, x: Tensor, out: Tensor, post: str) -> Tensor:
        return x + (getattr(self, post)(out) if self.post_norms else out)

    # Compile regions: Dynamo traces one layer's step and reuses the trace for the others, and
    # aot.trace_settings inlines them back into one flat graph (the same graph, less compile CPU:
    # docs/benchmarks.md, "Compile settings").
    @torch.compiler.nested_compile_region
    def prefill(self, x: Tensor, cos: Tensor, sin: Tensor, pages: Tensor, positions: Tensor,
                visible: Tensor) -> Tensor:
        h = self._residual(x, self.attention.prefill(self.attention_norm(x), cos, sin, pages, positions, visible),
                           "post_attention_norm")
        return self._residual(h, self.feed_forward(self.ffn_norm(h)), "post_ffn_norm")

    @torch.compiler.nested_compile_region
    def decode(self, x: Tensor, cos: Tensor, sin: Tensor, pages: Tensor, input_pos: Tensor, visible: Tensor) -> Tensor:
        h = self._residual(x, self.attention.decode(self.attention_norm(x), cos, sin, pages, input_pos, visible),
                           "post_attention_norm")
        return self._residual(h, self.feed_forward(self.ffn_norm(h)), "post_ffn_norm")


def projections(model: nn.Module) -> list[tuple[str, Linear]]:
    """The model's projections (its Linear modules), by name."""
    return [(name, m) for name, m in model.named_modules() if isinstance(m, Linear)]


class Transformer(nn.Module):
    rope_cos: Tensor  # buffers, registered by setup_cache
    rope_sin: Tensor
    rope_cos_local: Tensor
    rope_sin_local: Tensor

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.tok_embeddings: nn.Module = nn.Embedding(args.vocab_size, args.dim)  # quant.apply may swap it
        self.layers = cast("Sequence[Block]", nn.ModuleList(Block(args) for _ in range(args.n_layers)))  # all Blocks
        self.norm = RMSNorm(args.dim, args.norm_eps, args.norm_offset)
        self.output = Linear(args.dim, args.vocab_size, bias=False)
        self.max_seq = 0

    def pack_weights(self, dtype: torch.dtype) -> None:
        """Pack every projection weight for oneDNN in `dtype` (CPU; one the platform allows:
        handler.engine.platform.choose_path). Call after the weights are loaded: packing copies them."""
        for _, linear in projections(self):
            linear.pack(dtype)

    def use_matvec(self, batches: bool = False) -> None:
        """Single rows (and with `batches`, rows one per sequence, where packing made a wider copy)
        through ts_llm::bf16_linear in every projection that has CPU bf16 weights (its kernel must
        be loaded: handler.engine.kernels.build; call after pack_weights)."""
        for _, linear in projections(self):
            linear.use_matvec(batches)

    def setup_cache(self, pages: int, max_seq: int) -> None:
        """A KV cache of `pages` pages of PAGE positions (and a scratch page), shared by every sequence,
        each of at most max_seq positions."""
        dtype, device = self.norm.weight.dtype, self.norm.weight.device  # the model's (the embedding may be quantized)
        self.max_seq = max_seq
        for layer in self.layers:
            layer.attention.kv_cache = KVPages(pages, self.args.n_kv_heads, self.args.head_dim, dtype).to(device)
        for suffix in ("", "_local") if self.args.local_layers else ("",):  # the spare position too (padding writes it)
            cos, sin = rope_frequencies(self.args, max_seq + 1, local=bool(suffix))
            self.register_buffer("rope_cos" + suffix, cos.to(device), persistent=False)
            self.register_buffer("rope_sin" + suffix, sin.to(device), persistent=False)

    def _embed(self, tokens: Tensor) -> Tensor:
        x = self.tok_embeddings(tokens)
        if self.args.embed_scale:  # sqrt(dim) rounded to the weights' dtype first, as Gemma's reference
            x = x * torch.tensor(self.args.dim**0.5, dtype=x.dtype)
        return x

    def _ropes(self, positions: Tensor) -> list[tuple[Tensor, Tensor]]:
        """Each layer's (cos, sin) rows at `positions`, shaped as positions + [D]."""
        shared = (self.rope_cos[positions], self.rope_sin[positions])
        local = (self.rope_cos_local[positions], self.rope_sin_local[positions]) if self.args.local_layers else shared
        return [local if i in self.args.local_layers else shared for i in range(len(self.layers))]

    def _masks(self, visible: Tensor, positions: Tensor) -> list[Tensor]:
        """Each layer's visible positions ([..., S], causal up to `positions`); window_layers' only the last sliding_window."""
        if not self.args.window_layers:  # no narrowing to compute on an eager step
            return [visible] * len(self.layers)
        narrow = visible & (torch.arange(visible.shape[-1], device=visible.device) > positions[..., None] - (self.args.sliding_window or 0))
        return [narrow if i in self.args.window_layers else visible for i in range(len(self.layers))]

    @torch.no_grad()
    def copy_page(self, src: int, dst: int) -> None:
        """Every layer's KV page `src` into page `dst` (a shared page about to be written)."""
        for layer in self.layers:
            cast(KVPages, layer.attention.kv_cache).copy_page(src, dst)

    def prefill(self, tokens: Tensor, pages: Tensor, start_pos: Tensor, last_index: Tensor, kv_len: int) -> Tensor:
        """A chunk of each prompt, from any position (chunked prefill, a cached prefix). tokens:
        [B, T], right-padded chunks; row b holds positions start_pos[b].. of the sequence whose
        page table row is pages[b] ([B, N], N * PAGE > max_seq), whose earlier positions are
        already cached; last_index: [B], the column of the token whose next-token logits are
        returned ([B, V], float32); attention covers the first kv_len positions (kv_len > every
        real token's position). Padding columns write positions past the chunk (max_seq at most)
        into the row's own page or the scratch page, which nothing reads before they are written again."""
        # One row per sequence in every argument: compiled with each batch unbacked, torch cannot
        # otherwise tell that they agree (attention's q and keys).
        torch._check(last_index.shape[0] == tokens.shape[0])
        x = self.hidden(tokens, pages, start_pos, kv_len)
        last = x[torch.arange(x.shape[0], device=x.device), last_index]  # [B, dim]
        return self.output(self.norm(last)).float()

    def hidden(self, tokens: Tensor, pages: Tensor, start_pos: Tensor, kv_len: int) -> Tensor:
        """The last layer's output [B, T, dim] at every position of prefill's chunks (its arguments)."""
        b, t = tokens.shape
        for arg in (pages, start_pos):
            torch._check(arg.shape[0] == b)
        positions = (start_pos[:, None] + torch.arange(t, device=tokens.device)[None, :]).clamp(max=self.max_seq)  # [B, T]
        visible = torch.arange(kv_len, device=tokens.device)[None, None, :] <= positions[:, :, None]  # [B, T, S]
        x = self._embed(tokens)
        for layer, (cos, sin), seen in zip(self.layers, self._ropes(positions), self._masks(visible, positions), strict=True):
            x = layer.prefill(x, cos[:, None], sin[:, None], pages, positions, seen[:, None])
        return x

    def decode(self, tokens: Tensor, pages: Tensor, input_pos: Tensor, kv_len: int) -> Tensor:
        """One step for B sequences. tokens, input_pos: [B]; pages: [B, N], their page table rows;
        attends to the first kv_len positions (kv_len > max(input_pos)). Returns logits [B, V] (float32)."""
        torch._check(pages.shape[0] == tokens.shape[0])
        x = self._embed(tokens[:, None])
        visible = torch.arange(kv_len, device=tokens.device)[None, :] <= input_pos[:, None]  # [B, S]
        for layer, (cos, sin), seen in zip(self.layers, self._ropes(input_pos), self._masks(visible, input_pos), strict=True):
            x = layer.decode(x, cos[:, None, None, :], sin[:, None, None, :], pages, input_pos, seen)
        return self.output(self.norm(x[:, 0])).float()
