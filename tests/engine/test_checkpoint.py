"""Checkpoint configs: what the engine serves, read as transformers reads them; a GGUF served alone
keeps the rope scaling its file stores."""
import json
from dataclasses import replace

import numpy as np
import pytest
import torch

from handler.engine.checkpoint import CheckpointError, model_args_from_config, open_checkpoint
from handler.engine.model.rope import _llama3_scale, rope_frequencies

BASE = {"vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64}


def test_mistral_windows_every_layer():
    args = model_args_from_config({**BASE, "model_type": "mistral", "num_hidden_layers": 3, "sliding_window": 128})
    assert (args.sliding_window, args.window_layers) == (128, (0, 1, 2))


def test_layer_types_say_which_layers_are_windowed():
    config = {**BASE, "model_type": "mistral", "num_hidden_layers": 3, "sliding_window": 8,
              "layer_types": ["full_attention", "sliding_attention", "full_attention"]}
    assert model_args_from_config(config).window_layers == (1,)


def test_gemma3_windows_its_local_layers():
    config = {**BASE, "model_type": "gemma3_text", "num_hidden_layers": 6, "sliding_window": 512}
    args = model_args_from_config(config)
    assert args.window_layers == args.local_layers == (0, 1, 2, 3, 4)


def test_mistral_without_a_window_has_none():
    assert model_args_from_config({**BASE, "model_type": "mistral", "sliding_window": None}).sliding_window is None


def test_qwen2_window_counts_only_when_switched_on():
    config = {**BASE, "model_type": "qwen2", "sliding_window": 64}
    assert model_args_from_config({**config, "use_sliding_window": False}).sliding_window is None
    assert model_args_from_config({**config, "use_sliding_window": False}).window_layers == ()
    args = model_args_from_config({**config, "use_sliding_window": True, "num_hidden_layers": 4, "max_window_layers": 2})
    assert (args.sliding_window, args.window_layers) == (64, (2, 3))


def _gguf_alone(tmp_path, factors):
    """A checkpoint folder as a GGUF served alone stages it: config.json without rope scaling, a tokenizer, the file."""
    gguf = pytest.importorskip("gguf")
    writer = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "llama")
    writer.add_tensor("rope_freqs.weight", np.asarray(factors, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    (tmp_path / "config.json").write_text(json.dumps({**BASE, "model_type": "llama", "rope_theta": 500000.0}))
    (tmp_path / "tokenizer.json").write_text("{}")
    return tmp_path


def test_a_gguf_alone_keeps_its_llama3_rope_scaling(tmp_path):
    unscaled = 1.0 / (500000.0 ** (torch.arange(0, 16, 2, dtype=torch.float64) / 16))  # head_dim 16 (BASE)
    scaling = (8.0, 1.0, 4.0, 64)
    factors = (unscaled / _llama3_scale(unscaled, *scaling)).tolist()  # what llama.cpp's converter stores
    args = open_checkpoint(_gguf_alone(tmp_path, factors)).args
    assert args.rope_freq_factors is not None and len(args.rope_freq_factors) == 8
    expected = rope_frequencies(replace(args, rope_freq_factors=None, rope_llama3_scaling=scaling), 256)
    got = rope_frequencies(args, 256)
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(got, expected, strict=True))
    assert not torch.allclose(got[0], rope_frequencies(replace(args, rope_freq_factors=None), 256)[0])


def test_rope_factors_of_another_head_size_are_refused(tmp_path):
    with pytest.raises(CheckpointError, match="holds 3 factors, but a head of 16 has 8 frequencies"):
        open_checkpoint(_gguf_alone(tmp_path, [1.0, 2.0, 3.0]))
