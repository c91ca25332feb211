"""A tiny random Llama checkpoint (2 layers, 64 wide) with the default model's tokenizer: what
the AOT and compile-process tests compile in seconds instead of minutes."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory, default_checkpoint) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                         max_position_embeddings=256)
    path = tmp_path_factory.mktemp("tiny-llama")
    LlamaForCausalLM(config).save_pretrained(path, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(default_checkpoint / name, path / name)
    return path
