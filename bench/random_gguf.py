"""Random-weight GGUF files of Llama bodies too large to hold in floats (issue 59): the Llama-3.2-3B and
Llama-3.1-8B shapes with the default model's vocabulary, written as BF16 one tensor at a time (one
tensor's floats in memory, never the model's), with the tokenizer and chat template of a template
GGUF; llama-quantize then makes Q4_0 and Q4_K_M from it (peer_llamacpp.quantized_ggufs), and both
servers serve those files.

Beside the file, a checkpoint folder of its own: config.json (the shape, as transformers writes it)
and the default model's tokenizer files, no weights: ours serves the GGUF linked into it, as stored.
Speed does not depend on the values; the bench asks for exactly its tokens (`ignore_eos`)."""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

BODIES: dict[str, dict[str, Any]] = {
    "3b": {"hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 28, "num_attention_heads": 24,
           "num_key_value_heads": 8, "head_dim": 128, "tie_word_embeddings": True,
           "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
                               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}},
    "8b": {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
           "num_key_value_heads": 8, "head_dim": 128, "tie_word_embeddings": False,
           "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}},
}
COMMON = {"max_position_embeddings": 131072, "rms_norm_eps": 1e-5}
STD = 0.02  # the weights' spread (transformers' initializer_range)
KEPT_PREFIXES = ("tokenizer.",)  # what the template gives: its vocabulary and chat template


def body_config(key: str) -> dict[str, Any]:
    return {**BODIES[key], **COMMON}


def write_checkpoint(key: str, out_dir: Path, tokenizer_from: Path) -> Path:
    """out_dir/ with config.json for the body and the tokenizer of `tokenizer_from` (made once)."""
    marker = out_dir / "peer-model.json"
    if marker.is_file() and json.loads(marker.read_text()) == body_config(key):
        return out_dir
    from transformers import AutoTokenizer, LlamaConfig

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_from)
    config = LlamaConfig(vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, dtype="bfloat16", **body_config(key))
    out_dir.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    marker.write_text(json.dumps(body_config(key)))
    return out_dir


def rope_factors(rope: dict[str, Any], head_dim: int) -> np.ndarray:
    """llama.cpp's rope_freqs tensor for llama3 scaling: each frequency's divisor (1 for the fast ones,
    `factor` for the slow ones, blended between)."""
    factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    old = rope["original_max_position_embeddings"]
    out = []
    for i in range(0, head_dim, 2):
        wavelen = 2 * math.pi * rope["rope_theta"] ** (i / head_dim)
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, dtype=np.float32)


def tensors(key: str, vocab: int) -> list[tuple[str, tuple[int, ...]]]:
    """(GGUF name, shape [rows, columns]) in the order llama.cpp's converter writes them; norms and
    rope_freqs float32, the rest BF16."""
    c = body_config(key)
    d, hd = c["hidden_size"], c["head_dim"]
    q, kv, mlp = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd, c["intermediate_size"]
    out: list[tuple[str, tuple[int, ...]]] = [("rope_freqs.weight", (hd // 2,)), ("token_embd.weight", (vocab, d))]
    for i in range(c["num_hidden_layers"]):
        b = f"blk.{i}."
        out += [(b + "attn_norm.weight", (d,)), (b + "ffn_down.weight", (d, mlp)), (b + "ffn_gate.weight", (mlp, d)),
                (b + "ffn_up.weight", (mlp, d)), (b + "ffn_norm.weight", (d,)), (b + "attn_k.weight", (kv, d)),
                (b + "attn_output.weight", (d, q)), (b + "attn_q.weight", (q, d)), (b + "attn_v.weight", (kv, d))]
    out.append(("output_norm.weight", (d,)))
    if not c["tie_word_embeddings"]:
        out.append(("output.weight", (vocab, d)))
    return out


def write_bf16_gguf(key: str, template: Path, out: Path, seed: int = 0) -> Path:
    """`out`: the body's BF16 GGUF, random weights (norms 1), metadata from `template` for the tokenizer."""
    import gguf
    import torch

    reader = gguf.GGUFReader(template)
    vocab = len(reader.fields["tokenizer.ggml.tokens"].data)
    c = body_config(key)
    partial = out.with_suffix(".partial")
    writer = gguf.GGUFWriter(partial, "llama")
    writer.add_name(f"Llama body ({key}), random weights")
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_BF16)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.add_block_count(c["num_hidden_layers"])
    writer.add_context_length(c["max_position_embeddings"])
    writer.add_embedding_length(c["hidden_size"])
    writer.add_feed_forward_length(c["intermediate_size"])
    writer.add_head_count(c["num_attention_heads"])
    writer.add_head_count_kv(c["num_key_value_heads"])
    writer.add_key_length(c["head_dim"])
    writer.add_value_length(c["head_dim"])
    writer.add_rope_dimension_count(c["head_dim"])
    writer.add_rope_freq_base(c["rope_parameters"]["rope_theta"])
    writer.add_layer_norm_rms_eps(c["rms_norm_eps"])
    writer.add_vocab_size(vocab)
    for name, field in reader.fields.items():
        if name.startswith(KEPT_PREFIXES):
            kind = field.types[0]
            writer.add_key_value(name, field.contents(), kind, field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None)
    shapes = tensors(key, vocab)
    for name, shape in shapes:
        floats = len(shape) == 1
        writer.add_tensor_info(name, shape, np.dtype(np.float32 if floats else np.uint16), math.prod(shape) * (4 if floats else 2),
                               raw_dtype=None if floats else gguf.GGMLQuantizationType.BF16)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    generator = torch.Generator().manual_seed(seed)
    for name, shape in shapes:
        if name == "rope_freqs.weight":
            data = rope_factors(c["rope_parameters"], c["head_dim"])
        elif len(shape) == 1:
            data = np.ones(shape, dtype=np.float32)
        else:  # bf16 bits of normal(0, STD) values, a tensor at a time
            weights = torch.randn(shape, generator=generator).mul_(STD).bfloat16()
            data = weights.view(torch.int16).numpy().view(np.uint16)
        writer.write_tensor_data(data)
    writer.close()
    partial.rename(out)
    return out
