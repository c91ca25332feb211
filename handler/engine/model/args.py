"""What the engine knows of a model's shape and options: ModelArgs, read from a checkpoint's config
(checkpoint.model_args_from_config) or a GGUF's metadata."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelArgs:
    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    intermediate_size: int
    norm_eps: float
    rope_theta: float
    qkv_bias: bool = False
    qk_norm: bool = False  # Qwen3: each head's query and key RMS-normalized (over head_dim) before RoPE
    tie_embeddings: bool = False
    # Llama 3.1-style frequency scaling: (factor, low_freq_factor, high_freq_factor, original_max_pos)
    rope_llama3_scaling: tuple[float, float, float, int] | None = None
    # Each frequency's divisor, as a GGUF's rope_freqs tensor stores llama3 scaling (llama.cpp's
    # freq_factors): what a GGUF served alone gives, whose converted config has no rope_scaling
    rope_freq_factors: tuple[float, ...] | None = None
    # window_layers (Mistral: all; Gemma 3: its local ones) see the last sliding_window positions only
    sliding_window: int | None = None
    window_layers: tuple[int, ...] = ()
    # Gemma 3: norms scale by (norm_offset + w) in float32; embeddings times sqrt(dim); a norm
    # after attention and after the MLP too; GeGLU; queries scaled by attn_scale (else
    # head_dim ** -0.5); the sliding-window layers (local_layers) rotate with their own RoPE base.
    norm_offset: float = 0.0
    embed_scale: bool = False
    post_norms: bool = False
    gelu_mlp: bool = False
    attn_scale: float | None = None
    local_rope_theta: float | None = None
    local_layers: tuple[int, ...] = ()
