"""Shared fixtures: the default model checkpoint, converted once per machine, and a tiny random
Llama with its tokenizer (2 layers, 64 wide: compiled in seconds instead of minutes)."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session", autouse=True)
def private_user_cache(tmp_path_factory: pytest.TempPathFactory):
    """The handler's default compile cache is the user's cache directory: tests (and the
    TorchServe workers they start, which inherit this environment) get a private one."""
    old = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("xdg-cache"))
    yield
    if old is None:
        os.environ.pop("XDG_CACHE_HOME", None)
    else:
        os.environ["XDG_CACHE_HOME"] = old


def artifacts_dir() -> Path:
    return Path(os.environ.get("TS_LLM_ARTIFACTS", REPO / "artifacts"))


@pytest.fixture(scope="session")
def default_checkpoint() -> Path:
    from handler.engine.convert import ensure_default_checkpoint

    return ensure_default_checkpoint(artifacts_dir() / "checkpoints" / "smollm2-135m-instruct")


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory, default_checkpoint) -> Path:
    import torch
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
