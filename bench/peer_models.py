"""The models bench/peer.py compares on: the default one (SmolLM2-135M-Instruct, from its bf16
checkpoint and shipped Q4_1 GGUF), a 1B-class one: the Llama-3.2-1B body (hidden 2048, 16
layers, 32 query / 8 KV heads, MLP 8192, tied embeddings, llama3 rope scaling) with random weights
and the default model's tokenizer, and the Llama-3.2-3B and Llama-3.1-8B bodies, written straight
into GGUF files (random_gguf.py). Decode speed depends on the shapes, not the values, and the bench asks for exactly
`output_tokens` tokens (`ignore_eos`)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import peer_llamacpp as llamacpp, random_gguf
from bench.common import REPO
from handler.engine.convert import ensure_default_checkpoint

CHECKPOINTS = REPO / "artifacts" / "checkpoints"


@dataclass(frozen=True)
class PeerModel:
    key: str  # --model
    name: str  # in the results
    out: str  # the results' default name
    ours_gguf: dict[str, str]  # precision -> the GGUF type ours serves beside the checkpoint


MODELS = {m.key: m for m in (
    # int4: the file llama.cpp's fastest 4-bit run serves (Q4_0, its embedding in Q8_0: 576 columns
    # are no whole k-quant super-block); ./serve.sh serves the shipped Q4_1 (peer.py --ours-int4 Q4_1)
    PeerModel("default", "SmolLM2-135M-Instruct", "peer", {"int8": "Q8_0", "int4": "Q4_0"}),
    # no shipped file: ours serves the very Q4_0 file llama.cpp serves (its tied head in Q6_K)
    PeerModel("1b", "Llama-3.2-1B body, random weights", "peer_1b", {"int8": "Q8_0", "int4": "Q4_0"}),
    # written as GGUF only (random_gguf.py): ours serves the very files llama.cpp serves, Q4_0 or Q4_K_M
    PeerModel("3b", "Llama-3.2-3B body, random weights", "peer_3b", {"int8": "Q8_0", "int4": "Q4_0"}),
    PeerModel("8b", "Llama-3.1-8B body, random weights", "peer_8b", {"int8": "Q8_0", "int4": "Q4_0"}),
)}

ONE_B: dict[str, Any] = {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32,
         "num_key_value_heads": 8, "head_dim": 64, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
         "tie_word_embeddings": True,
         "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}


def checkpoint(model: PeerModel) -> Path:
    default = ensure_default_checkpoint(CHECKPOINTS / "smollm2-135m-instruct")
    if model.key in random_gguf.BODIES:  # config and tokenizer only: the weights are the GGUF linked in
        return random_gguf.write_checkpoint(model.key, CHECKPOINTS / f"llama-{model.key}-random", default)
    return default if model.key == "default" else random_1b(CHECKPOINTS / "llama-1b-random", default)


def ggufs(model: PeerModel, build: dict, ckpt: Path, kinds: list[str]) -> dict[str, Path]:
    if model.key == "default":
        return llamacpp.default_ggufs(build, kinds)
    if model.key in random_gguf.BODIES:
        base = llamacpp.cache_root() / "gguf" / ckpt.name
        bf16 = llamacpp.gguf_path(base, "BF16")
        missing = [kind for kind in kinds if not llamacpp.gguf_path(base, kind).is_file()]
        if missing and not bf16.is_file():
            template = llamacpp.default_ggufs(build, ["BF16"])["BF16"]
            print(f"random {model.key} body -> {bf16}", flush=True)
            random_gguf.write_bf16_gguf(model.key, template, bf16)
        files = llamacpp.quantized_ggufs(build, base, kinds)
        bf16.unlink(missing_ok=True)  # 6-16 GB, needed again only for a type not made yet
        return files
    return llamacpp.checkpoint_ggufs(build, ckpt, kinds)


def random_1b(out_dir: Path, tokenizer_from: Path) -> Path:
    """A bf16 safetensors checkpoint with the 1B body and random weights (made once, ~2 GB)."""
    marker = out_dir / "peer-model.json"
    if marker.is_file() and json.loads(marker.read_text()) == ONE_B:
        return out_dir
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    print(f"random 1B-class checkpoint -> {out_dir}", flush=True)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_from)
    config = LlamaConfig(vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, dtype="bfloat16", **ONE_B)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).bfloat16()
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    marker.write_text(json.dumps(ONE_B))
    return out_dir
