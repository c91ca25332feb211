"""The handler: section is parsed once, strictly, into a final tree."""
from pathlib import Path

import pytest

from handler.serving.config import SECTION_KEYS, ConfigError, HandlerConfig

MODEL_DIR = Path("/models/llm")


def parse(model_yaml, gpu_id=None, environ=None):
    return HandlerConfig.from_model_yaml(model_yaml, MODEL_DIR, gpu_id, environ={} if environ is None else environ)


def test_defaults_and_batching_mode_from_the_frontend_key():
    cfg = parse({"continuousBatching": True, "batchSize": 8, "handler": {"dtype": "float32"}})
    assert cfg.batching == "continuous" and cfg.engine.dtype == "float32" and cfg.engine.max_batch_size == 32


@pytest.mark.parametrize("keys,mode", [({"asyncCommunication": True}, "async"),
                                       ({"asyncCommunication": True, "continuousBatching": True}, "async"),
                                       ({}, "dynamic")])
def test_batching_mode_follows_torchserve_s_keys(keys, mode):
    assert parse(keys).batching == mode


def test_engine_keys_go_to_the_engine_and_the_rest_stay():
    cfg = parse({"handler": {"max_seq_len": 512, "threads": 4, "max_new_tokens_cap": 256}})
    assert (cfg.engine.max_seq_len, cfg.engine.threads, cfg.max_new_tokens_cap) == (512, 4, 256)


def test_unknown_key_is_rejected_with_the_allowed_list():
    with pytest.raises(ConfigError, match=r"unknown key 'max_tokens' in handler; allowed keys: .*max_new_tokens_cap"):
        parse({"handler": {"max_tokens": 5}})


def test_the_allowed_keys_are_the_flat_section():
    assert "checkpoint" in SECTION_KEYS and "dtype" in SECTION_KEYS and "served_model_name" in SECTION_KEYS
    assert not {"engine", "checkpoint_dir", "batching"} & set(SECTION_KEYS)


def test_wrong_type_is_rejected():
    with pytest.raises(ConfigError, match=r"handler\.max_seq_len must be an integer"):
        parse({"handler": {"max_seq_len": True}})
    with pytest.raises(ConfigError, match=r"handler\.dtype must be one of 'auto', 'bfloat16', 'float32', got 16"):
        parse({"handler": {"dtype": 16}})
    with pytest.raises(ConfigError, match=r"handler\.served_model_name must be a string"):
        parse({"handler": {"served_model_name": 16}})


def test_an_unknown_threading_is_rejected():
    with pytest.raises(ConfigError, match=r"handler\.threading must be one of 'pool', 'openmp', got 'gomp'"):
        parse({"handler": {"threading": "gomp"}})


def test_batch_size_larger_than_the_engine_is_rejected():
    with pytest.raises(ConfigError, match=r"batchSize 64 exceeds handler\.max_batch_size 32"):
        parse({"batchSize": 64, "handler": {}})


def test_invalid_engine_value_names_the_section():
    with pytest.raises(ConfigError, match=r"handler\.dtype must be one of 'auto', 'bfloat16', 'float32', got 'float16'"):
        parse({"handler": {"dtype": "float16"}})


def test_engine_range_check_is_reported_as_a_config_error():
    message = "model-config.yaml `handler:`: need max_batch_size >= 1 and max_seq_len >= 32"
    with pytest.raises(ConfigError, match=message):
        parse({"handler": {"max_seq_len": 8}})


def test_cuda_device_uses_the_workers_gpu():
    cfg = parse({"handler": {"device": "cuda", "checkpoint": "ckpt"}}, gpu_id=3)
    assert cfg.engine.device == "cuda:3" and cfg.engine.checkpoint_dir == MODEL_DIR / "ckpt"


def test_absolute_checkpoint_is_used_as_is():
    assert parse({"handler": {"checkpoint": "/weights/llm"}}).engine.checkpoint_dir == Path("/weights/llm")


def test_legacy_boolean_packed_weights_reads_as_auto_or_off():
    assert parse({"handler": {"packed_weights": True}}).engine.packed_weights == "auto"
    assert parse({"handler": {"packed_weights": False}}).engine.packed_weights == "off"


def test_cache_dir_falls_back_to_the_environment():
    assert parse({"handler": {}}, environ={"TS_LLM_CACHE_DIR": "/cache/aot"}).compile_cache_dir == "/cache/aot"
    named = parse({"handler": {"compile_cache_dir": "/mine"}}, environ={"TS_LLM_CACHE_DIR": "/cache/aot"})
    assert named.compile_cache_dir == "/mine"


def test_without_either_the_cache_dir_is_the_users_cache():
    assert parse({"handler": {}}, environ={"HOME": "/home/ann"}).compile_cache_dir == "/home/ann/.cache/ts-llm/aot"
    xdg = parse({"handler": {}}, environ={"HOME": "/home/ann", "XDG_CACHE_HOME": "/var/cache/ann"})
    assert xdg.compile_cache_dir == "/var/cache/ann/ts-llm/aot"


def test_an_environment_without_a_home_has_no_cache_dir():
    assert parse({"handler": {}}, environ={}).compile_cache_dir is None


def test_default_max_new_tokens_must_fit_the_cap():
    with pytest.raises(ConfigError, match="default_max_new_tokens must be between 1 and max_new_tokens_cap"):
        parse({"handler": {"default_max_new_tokens": 2048}})


def test_section_must_be_a_mapping():
    with pytest.raises(ConfigError, match=r"model-config\.yaml `handler:` must be a mapping, got list"):
        parse({"handler": ["dtype"]})


def test_a_negative_continuous_call_time_is_rejected():
    with pytest.raises(ConfigError, match="continuous_call_ms must be >= 0"):
        parse({"handler": {"continuous_call_ms": -1}})


def test_the_users_cache_is_a_shelf_of_artifacts_and_the_pods_volume_one_artifact():
    assert parse({"handler": {}}, environ={"HOME": "/home/ann"}).compile_cache_shelf is True
    assert not parse({"handler": {}}, environ={"TS_LLM_CACHE_DIR": "/cache/aot"}).compile_cache_shelf
    assert not parse({"handler": {"compile_cache_dir": "/mine"}}, environ={"HOME": "/home/ann"}).compile_cache_shelf
    named = parse({"handler": {"compile_cache_dir": "/mine", "compile_cache_shelf": True}})
    assert named.compile_cache_shelf is True and named.compile_cache_shelf_mb == 4096


def test_a_shelf_bound_below_one_megabyte_is_refused():
    with pytest.raises(ConfigError, match="compile_cache_shelf_mb must be >= 1"):
        parse({"handler": {"compile_cache_shelf_mb": 0}})


def test_the_resume_store_and_secret_fall_back_to_the_environment():
    env = {"TS_LLM_RESUME_STORE": "s3://fleet/llm", "TS_LLM_RESUME_SECRET_FILE": "/var/run/ts-llm-resume/secret"}
    cfg = parse({"handler": {}}, environ=env)
    assert (cfg.resume_store, cfg.resume_secret_file) == ("s3://fleet/llm", "/var/run/ts-llm-resume/secret")
    assert parse({"handler": {"resume_store": "/shared"}}, environ=env).resume_store == "/shared"


def test_a_secret_and_fleet_keys_together_are_refused():
    with pytest.raises(ConfigError, match="set one"):
        parse({"handler": {"resume_secret_file": "/s", "resume_public_key": "/k.pub"}})


def test_a_signing_key_without_its_public_key_is_refused():
    with pytest.raises(ConfigError, match="resume_public_key"):
        parse({"handler": {"resume_signing_key": "/k.pem"}})
