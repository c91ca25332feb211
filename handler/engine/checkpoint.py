"""Load a local checkpoint directory of the Llama family into `Transformer`.

Weights come from safetensors (never pickle), or, in a directory with no safetensors, from its
GGUF file alone (archive.sh writes config.json and the tokenizer beside a GGUF it is given:
handler.packing.gguf_checkpoint). Supported `model_type`s: llama (Llama 2/3, SmolLM), mistral,
qwen2 (q/k/v biases), qwen3 (q/k RMSNorm), gemma3_text (Gemma 3 270M / 1B: sandwich norms, GeGLU,
scaled embeddings, local and global RoPE, local layers with a sliding window). Sliding-window
attention (Mistral, Gemma 3's local layers, Qwen2/3 with use_sliding_window) is computed as
transformers does: a windowed layer's position sees the last `sliding_window` positions.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from safetensors import safe_open

from handler.engine import EngineError
from handler.engine.config import find_gguf
from handler.engine.model.args import ModelArgs
from handler.engine.model.transformer import Transformer, projections as model_projections
from handler.engine.quant.gguf import GGUFWeights, to_float

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma3_text")
REQUIRED_FILES = ("config.json", "tokenizer.json")
ROPE_FACTORS = "rope_freqs.weight"  # a GGUF's llama3 scaling, per frequency


class CheckpointError(EngineError, ValueError):
    """The checkpoint directory cannot be served; the message says what to fix."""


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    args: ModelArgs
    config: dict
    weight_files: tuple[Path, ...]
    gguf: Path | None = None  # the quantized form beside the float weights (quantization: gguf/auto), or the only one

    @property
    def gguf_only(self) -> bool:
        return not self.weight_files

    @property
    def digested_files(self) -> tuple[Path, ...]:
        """What a compiled artifact's key hashes: every file weights may come from."""
        return self.weight_files + ((self.gguf,) if self.gguf else ())


def open_checkpoint(path: Path) -> Checkpoint:
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"checkpoint directory {path} does not exist")
    for name in REQUIRED_FILES:
        if not (path / name).is_file():
            raise CheckpointError(f"checkpoint {path} is missing {name}")
    weight_files = tuple(sorted(path.glob("*.safetensors")))
    try:
        gguf = find_gguf(path)
    except ValueError as err:
        raise CheckpointError(str(err)) from None
    if not weight_files and gguf is None:
        found = sorted(p.name for p in path.glob("*.bin")) + sorted(p.name for p in path.glob("*.pt*"))
        hint = f" (found {', '.join(found)}: pickle weights are not loaded; convert them to safetensors)" if found else ""
        raise CheckpointError(f"checkpoint {path} has no *.safetensors or *.gguf weights{hint}")
    config = json.loads((path / "config.json").read_text())
    args = model_args_from_config(config)
    if gguf is not None and not weight_files:
        args = with_rope_factors(args, GGUFWeights(gguf))
    return Checkpoint(path, args, config, weight_files, gguf)


def with_rope_factors(args: ModelArgs, gguf: GGUFWeights) -> ModelArgs:
    """`args` with the file's rope_freqs (Llama 3.x GGUFs: llama3 scaling as each frequency's divisor)
    where the config names no scaling: transformers' GGUF conversion drops it, and without it every
    position would be rotated as an unscaled model's."""
    if args.rope_llama3_scaling is not None or not gguf.has(ROPE_FACTORS):
        return args
    factors = gguf.floats(ROPE_FACTORS).flatten().tolist()
    if len(factors) != args.head_dim // 2:
        raise CheckpointError(f"{gguf.path.name}: {ROPE_FACTORS} holds {len(factors)} factors, "
                              f"but a head of {args.head_dim} has {args.head_dim // 2} frequencies")
    return replace(args, rope_freq_factors=tuple(factors))


def model_args_from_config(config: dict) -> ModelArgs:
    model_type = config.get("model_type")
    if model_type == "gemma3" and "text_config" in config:
        raise CheckpointError("model_type 'gemma3' is Gemma 3 with its vision tower (4B and up); the text-only "
                              "Gemma 3 models (model_type gemma3_text: 270M, 1B) are served")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise CheckpointError(
            f"unsupported architecture model_type={model_type!r} "
            f"(architectures={config.get('architectures')}); supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    missing = [k for k in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size") if k not in config]
    if missing:
        raise CheckpointError(f"config.json is missing {', '.join(missing)}")
    n_heads = config["num_attention_heads"]
    dim = config["hidden_size"]
    family = _gemma3(config) if model_type == "gemma3_text" else {"rope_theta": _rope_theta(config),
                                                                  "qk_norm": model_type == "qwen3"}
    return ModelArgs(
        vocab_size=config["vocab_size"],
        dim=dim,
        n_layers=config["num_hidden_layers"],
        n_heads=n_heads,
        n_kv_heads=config.get("num_key_value_heads") or n_heads,
        head_dim=config.get("head_dim") or dim // n_heads,
        intermediate_size=config["intermediate_size"],
        norm_eps=config.get("rms_norm_eps", 1e-6),
        qkv_bias=model_type == "qwen2" or bool(config.get("attention_bias", False)),
        tie_embeddings=bool(config.get("tie_word_embeddings", model_type == "gemma3_text")),
        rope_llama3_scaling=None if model_type == "gemma3_text" else _llama3_scaling(config),
        sliding_window=(window := _sliding_window(model_type, config)),
        window_layers=_window_layers(model_type, config, window, family.get("local_layers", ())),
        **family,
    )


def _gemma3(config: dict) -> dict:
    """Gemma 3's own ModelArgs fields; what it may carry that the engine does not compute is refused."""
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        if config.get(key) is not None:
            raise CheckpointError(f"config.json sets {key}, which the engine does not implement")
    if config.get("hidden_activation", "gelu_pytorch_tanh") != "gelu_pytorch_tanh":
        raise CheckpointError(f"unsupported hidden_activation {config['hidden_activation']!r}; supported: gelu_pytorch_tanh")
    ropes = config.get("rope_parameters") or {}  # transformers >= 5: one per layer type
    full = ropes.get("full_attention") or {"rope_theta": config.get("rope_theta", 1e6), **(config.get("rope_scaling") or {})}
    local = ropes.get("sliding_attention") or {"rope_theta": config.get("rope_local_base_freq", 1e4)}
    for params in (full, local):
        if params.get("rope_type", params.get("type", "default")) != "default":
            raise CheckpointError(f"unsupported rope scaling {params.get('rope_type', params.get('type'))!r}; supported: default")
    every = config.get("sliding_window_pattern", 6)
    types = config.get("layer_types") or ["full_attention" if (i + 1) % every == 0 else "sliding_attention"
                                           for i in range(config["num_hidden_layers"])]
    return {"rope_theta": float(full["rope_theta"]), "local_rope_theta": float(local["rope_theta"]),
            "local_layers": tuple(i for i, kind in enumerate(types) if kind == "sliding_attention"),
            "qk_norm": True, "norm_offset": 1.0, "embed_scale": True, "post_norms": True, "gelu_mlp": True,
            "attn_scale": float(config.get("query_pre_attn_scalar", 256)) ** -0.5}


def _window_layers(model_type: str, config: dict, window: int | None, local_layers: tuple[int, ...]) -> tuple[int, ...]:
    """The layers that see only the last `window` positions, as transformers picks them (Gemma 3:
    its local layers, already derived)."""
    n = config["num_hidden_layers"]
    if window is None:
        return ()
    if model_type == "gemma3_text":
        return local_layers
    if config.get("layer_types"):
        return tuple(i for i, kind in enumerate(config["layer_types"]) if kind == "sliding_attention")
    if model_type in ("qwen2", "qwen3"):  # the layers from max_window_layers on
        return tuple(range(int(config.get("max_window_layers", n)), n))
    return tuple(range(n))


def _sliding_window(model_type: str, config: dict) -> int | None:
    # Qwen2/3 configs carry a sliding_window that only use_sliding_window switches on.
    if model_type in ("qwen2", "qwen3") and not config.get("use_sliding_window", False):
        return None
    window = config.get("sliding_window")
    return int(window) if window is not None else None


def _rope_params(config: dict) -> dict:
    # transformers >= 5 writes "rope_parameters"; older checkpoints "rope_theta" + "rope_scaling".
    return config.get("rope_parameters") or config.get("rope_scaling") or {}


def _rope_theta(config: dict) -> float:
    return float(_rope_params(config).get("rope_theta", config.get("rope_theta", 10000.0)))


def _llama3_scaling(config: dict) -> tuple[float, float, float, int] | None:
    params = _rope_params(config)
    kind = params.get("rope_type", params.get("type", "default"))
    if kind in ("default", None):
        return None
    if kind != "llama3":
        raise CheckpointError(f"unsupported rope scaling {kind!r}; supported: default, llama3")
    return (
        float(params["factor"]),
        float(params["low_freq_factor"]),
        float(params["high_freq_factor"]),
        int(params["original_max_position_embeddings"]),
    )


def load_model(ckpt: Checkpoint, dtype: torch.dtype, device: str | torch.device = "cpu",
               projections: bool = True) -> Transformer:
    """`projections=False` (a GGUF-only checkpoint served as stored): the projections and the
    embedding stay on the meta device, for handler.engine.quant.apply to fill from the file, never
    dequantized here; the model stays on the CPU then (the caller moves it once they are filled)."""
    with torch.device("meta"):
        model = Transformer(ckpt.args)
    names = [name for name, _ in model_projections(model)]
    if ckpt.gguf_only:
        assert ckpt.gguf is not None, "a checkpoint without float weights has its GGUF file"
        state = gguf_state(GGUFWeights(ckpt.gguf), ckpt.args, dtype, names if projections else [])
    else:
        state = _to_engine_names(_read_state(ckpt, dtype), ckpt.args)
    missing, unexpected = model.load_state_dict(state, assign=True, strict=False)
    expected = set() if projections else {f"{name}.weight" for name in names} | {"tok_embeddings.weight"}
    if set(missing) != expected or unexpected:
        raise CheckpointError(f"weights do not fit the model: missing {sorted(set(missing) - expected)}, "
                              f"unexpected {sorted(unexpected)}")
    return (model.to(device) if projections else model).eval().requires_grad_(False)


def gguf_state(gguf: GGUFWeights, args: ModelArgs, dtype: torch.dtype, projections: list[str]) -> dict[str, torch.Tensor]:
    """The engine's tensors from a GGUF file in `dtype` (quantized ones dequantized): norms, biases,
    and with the named projections (none: all are taken as stored) the embedding."""
    def norm(name: str) -> torch.Tensor:  # llama.cpp stores Gemma's norms with their offset added
        return (gguf.floats(name) - args.norm_offset).to(dtype)

    out = {"norm.weight": norm("output_norm.weight")}
    if projections:
        out["tok_embeddings.weight"] = gguf.floats("token_embd.weight").to(dtype)
    names = {"attention_norm": "attn_norm", "ffn_norm": "ffn_norm", "attention.q_norm": "attn_q_norm",
             "attention.k_norm": "attn_k_norm", "post_attention_norm": "post_attention_norm", "post_ffn_norm": "post_ffw_norm"}
    wanted = ["attention_norm", "ffn_norm"] + ["attention.q_norm", "attention.k_norm"] * args.qk_norm \
        + ["post_attention_norm", "post_ffn_norm"] * args.post_norms
    for i in range(args.n_layers):
        blk, dst = f"blk.{i}.", f"layers.{i}."
        for ours in wanted:
            out[f"{dst}{ours}.weight"] = norm(f"{blk}{names[ours]}.weight")
        if args.qkv_bias:
            out[dst + "attention.wqkv.bias"] = gguf.bias(dst + "attention.wqkv", args).to(dtype)
    for name in projections:
        if name == "output" and not gguf.has("output.weight"):  # tied: the head is the embedding
            out["output.weight"] = out["tok_embeddings.weight"]
            continue
        out[f"{name}.weight"] = to_float(gguf.projection(name, args)).to(dtype)
    return out


def _read_state(ckpt: Checkpoint, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = {}
    for file in ckpt.weight_files:
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - a safetensors handle, not a dict
                state[name] = f.get_tensor(name).to(dtype)
    return state


def _to_engine_names(hf: dict[str, torch.Tensor], args: ModelArgs) -> dict[str, torch.Tensor]:
    def take(name: str) -> torch.Tensor:
        if name not in hf:
            raise CheckpointError(f"weights are missing tensor {name}")
        return hf[name]

    out = {"tok_embeddings.weight": take("model.embed_tokens.weight"), "norm.weight": take("model.norm.weight")}
    out["output.weight"] = out["tok_embeddings.weight"] if args.tie_embeddings else take("lm_head.weight")
    for i in range(args.n_layers):
        src, dst = f"model.layers.{i}.", f"layers.{i}."
        attn = src + "self_attn."
        out[dst + "attention.wqkv.weight"] = torch.cat([take(attn + f"{p}_proj.weight") for p in "qkv"])
        if args.qkv_bias:
            out[dst + "attention.wqkv.bias"] = torch.cat([take(attn + f"{p}_proj.bias") for p in "qkv"])
        out[dst + "attention.wo.weight"] = take(attn + "o_proj.weight")
        if args.qk_norm:
            out[dst + "attention.q_norm.weight"] = take(attn + "q_norm.weight")
            out[dst + "attention.k_norm.weight"] = take(attn + "k_norm.weight")
        mlp = src + "mlp."
        out[dst + "feed_forward.w13.weight"] = torch.cat([take(mlp + "gate_proj.weight"), take(mlp + "up_proj.weight")])
        out[dst + "feed_forward.w2.weight"] = take(mlp + "down_proj.weight")
        out[dst + "attention_norm.weight"] = take(src + "input_layernorm.weight")
        if args.post_norms:  # Gemma 3: a norm before and after each of attention and the MLP
            out[dst + "post_attention_norm.weight"] = take(src + "post_attention_layernorm.weight")
            out[dst + "ffn_norm.weight"] = take(src + "pre_feedforward_layernorm.weight")
            out[dst + "post_ffn_norm.weight"] = take(src + "post_feedforward_layernorm.weight")
        else:
            out[dst + "ffn_norm.weight"] = take(src + "post_attention_layernorm.weight")
    return out
