"""The handler: section is parsed once, strictly."""
import pytest

from handler.serving.config import ConfigError, HandlerConfig


def test_defaults_and_batching_mode_from_the_frontend_key():
    cfg = HandlerConfig.from_model_yaml({"continuousBatching": True, "batchSize": 8, "handler": {"dtype": "float32"}})
    assert cfg.continuous_batching and cfg.dtype == "float32" and cfg.max_batch_size == 32


def test_unknown_key_is_rejected_with_the_allowed_list():
    with pytest.raises(ConfigError, match="unknown key\\(s\\) max_tokens .* allowed: .*max_new_tokens_cap"):
        HandlerConfig.from_model_yaml({"handler": {"max_tokens": 5}})


def test_wrong_type_is_rejected():
    with pytest.raises(ConfigError, match="handler.max_seq_len must be an integer"):
        HandlerConfig.from_model_yaml({"handler": {"max_seq_len": True}})
    with pytest.raises(ConfigError, match="handler.dtype must be str"):
        HandlerConfig.from_model_yaml({"handler": {"dtype": 16}})


def test_batch_size_larger_than_the_engine_is_rejected():
    with pytest.raises(ConfigError, match="batchSize 64 exceeds handler.max_batch_size 32"):
        HandlerConfig.from_model_yaml({"batchSize": 64, "handler": {}})


def test_invalid_engine_value_names_the_section(tmp_path):
    cfg = HandlerConfig.from_model_yaml({"handler": {"dtype": "float16"}})
    with pytest.raises(ConfigError, match="dtype must be auto or one of"):
        cfg.engine_config(tmp_path, None)


def test_cuda_device_uses_the_workers_gpu(tmp_path):
    cfg = HandlerConfig.from_model_yaml({"handler": {"device": "cuda", "checkpoint": "ckpt"}})
    engine = cfg.engine_config(tmp_path, 3)
    assert engine.device == "cuda:3" and engine.checkpoint_dir == tmp_path / "ckpt"
