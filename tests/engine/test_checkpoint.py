"""Checkpoint configs: what the engine serves exactly, and what it refuses."""
import pytest

from handler.engine.checkpoint import CheckpointError, check_context, model_args_from_config

BASE = {"vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64}


def test_a_sliding_window_longer_context_is_refused_with_the_fix():
    args = model_args_from_config({**BASE, "model_type": "mistral", "sliding_window": 128})
    with pytest.raises(CheckpointError, match=r"sliding-window attention .* set handler.max_seq_len to at most 128"):
        check_context(args, 512)


def test_a_context_within_the_window_is_served():
    check_context(model_args_from_config({**BASE, "model_type": "mistral", "sliding_window": 128}), 128)


def test_mistral_without_a_window_has_none():
    assert model_args_from_config({**BASE, "model_type": "mistral", "sliding_window": None}).sliding_window is None


def test_qwen2_window_counts_only_when_switched_on():
    config = {**BASE, "model_type": "qwen2", "sliding_window": 64}
    assert model_args_from_config({**config, "use_sliding_window": False}).sliding_window is None
    assert model_args_from_config({**config, "use_sliding_window": True}).sliding_window == 64
