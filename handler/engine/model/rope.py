"""Rotary position embedding: the cos / sin tables of a model (its base, and llama3 scaling as
parameters or as a GGUF's per-frequency factors) and their rotation of queries and keys."""
from __future__ import annotations

import math

import torch
from torch import Tensor

from handler.engine.model.args import ModelArgs


def rope_frequencies(args: ModelArgs, max_seq: int, local: bool = False) -> tuple[Tensor, Tensor]:
    """cos, sin tables of shape [max_seq, D] in float32 (rotate-half convention, as HF); `local`:
    the sliding-window layers' (their own base, no scaling)."""
    theta = args.local_rope_theta if local else args.rope_theta
    assert theta is not None, "local RoPE tables need local_rope_theta"
    inv_freq = 1.0 / (theta ** (torch.arange(0, args.head_dim, 2, dtype=torch.float64) / args.head_dim))
    if args.rope_llama3_scaling is not None and not local:
        inv_freq = _llama3_scale(inv_freq, *args.rope_llama3_scaling)
    elif args.rope_freq_factors is not None and not local:
        inv_freq = inv_freq / torch.tensor(args.rope_freq_factors, dtype=torch.float64)
    angles = torch.outer(torch.arange(max_seq, dtype=torch.float64), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().float(), angles.sin().float()


def _llama3_scale(inv_freq: Tensor, factor: float, low: float, high: float, original_max: int) -> Tensor:
    wavelen = 2 * math.pi / inv_freq
    low_wavelen, high_wavelen = original_max / low, original_max / high
    smooth = (original_max / wavelen - low) / (high - low)
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    mid = (1 - smooth) * scaled / factor + smooth * scaled
    is_mid = (wavelen <= low_wavelen) & (wavelen >= high_wavelen)
    return torch.where(is_mid, mid, scaled)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    # x: [B, heads, T, D]; cos, sin: [B, 1, T, D]
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return (x.float() * cos + rotated.float() * sin).to(x.dtype)
