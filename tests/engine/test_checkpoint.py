"""Checkpoint configs: what the engine serves, read as transformers reads them."""

from handler.engine.checkpoint import model_args_from_config

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
