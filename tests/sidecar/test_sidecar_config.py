"""SidecarConfig parsing: YAML and flags, typed, unknown keys rejected."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from handler.sidecar.config import (
    Cloud,
    SidecarConfig,
    StopMethod,
    add_config_arguments,
    config_from_args,
    config_from_mapping,
    load_config,
)
from handler.sidecar.errors import ConfigError


def parse_flags(argv: list[str]) -> SidecarConfig:
    parser = argparse.ArgumentParser()
    add_config_arguments(parser)
    return config_from_args(parser.parse_args(argv))


def test_unknown_key_rejected_naming_it_and_listing_allowed(tmp_path: Path) -> None:
    path = tmp_path / "sidecar.yaml"
    path.write_text("model_name: llm\ndrain_margin_secs: 3\n")
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    message = str(raised.value)
    assert "unknown key 'drain_margin_secs'" in message and "sidecar.yaml" in message
    assert "allowed keys:" in message and "drain_margin_s" in message


def test_yaml_values_are_typed(tmp_path: Path) -> None:
    path = tmp_path / "sidecar.yaml"
    path.write_text("clouds: [aws, azure]\ndrain_margin_s: 3\nstop_method: none\n"
                    "elb_target_port: 8080\ndrain_on_rebalance: true\n")
    config = load_config(path)
    assert config.clouds == (Cloud.AWS, Cloud.AZURE)
    assert config.drain_margin_s == 3.0 and isinstance(config.drain_margin_s, float)
    assert config.stop_method is StopMethod.NONE and config.elb_target_port == 8080
    assert config.drain_on_rebalance is True


def test_flags_override_the_file(tmp_path: Path) -> None:
    path = tmp_path / "sidecar.yaml"
    path.write_text("drain_margin_s: 3\nmodel_name: a\n")
    config = parse_flags(["--config", str(path), "--drain-margin-s", "7.5", "--clouds", "gcp,aws"])
    assert (config.drain_margin_s, config.model_name) == (7.5, "a")
    assert config.clouds == (Cloud.GCP, Cloud.AWS)


def test_bad_value_names_the_key() -> None:
    with pytest.raises(ConfigError, match="quiet_s must be a number, got 'soon'"):
        config_from_mapping({"quiet_s": "soon"})


def test_bool_is_not_an_int() -> None:
    with pytest.raises(ConfigError, match="listen_port"):
        config_from_mapping({"listen_port": True})


def test_unknown_cloud_rejected() -> None:
    with pytest.raises(ConfigError, match=r"clouds\[1\] must be one of 'aws', 'gcp', 'azure', got 'oracle'"):
        config_from_mapping({"clouds": "aws,oracle"})


def test_pid_stop_needs_a_pid_file() -> None:
    with pytest.raises(ConfigError, match="torchserve_pid_file"):
        config_from_mapping({"stop_method": "pid"})


def test_defaults_are_valid_and_frozen() -> None:
    config = SidecarConfig()
    with pytest.raises(AttributeError):
        config.drain_margin_s = 2.0  # type: ignore[misc]
    assert config.drain_policy().margin_s == 1.0
    assert config.drain_policy().quiet_polls == 2


def test_top_level_must_be_a_mapping(tmp_path: Path) -> None:
    path = tmp_path / "sidecar.yaml"
    path.write_text("- drain_margin_s\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(path)


def test_cache_settings_go_together() -> None:
    with pytest.raises(ConfigError, match="go together"):
        config_from_mapping({"cache_store": "s3://b/p"})


def test_cache_key_defaults_to_the_key_file_in_the_cache_dir() -> None:
    config = config_from_mapping({"cache_store": "s3://b/p", "cache_dir": "/var/cache/ts-llm"})
    assert config.cache_key_path == Path("/var/cache/ts-llm/cache-key.json")
    explicit = config_from_mapping({"cache_store": "s3://b/p", "cache_dir": "/c",
                                    "cache_key": "/image/llm.cache-key.json"})
    assert explicit.cache_key_path == Path("/image/llm.cache-key.json")


def test_empty_flag_value_unsets_an_optional_key() -> None:
    # --metrics-url= turns the running-gauge read off (queue only).
    assert parse_flags(["--metrics-url="]).metrics_url is None
    assert SidecarConfig().metrics_url == "http://127.0.0.1:8082/metrics"


def test_quiet_polls_must_be_positive() -> None:
    with pytest.raises(ConfigError, match="quiet_polls"):
        config_from_mapping({"quiet_polls": 0})


def test_min_wait_reaches_the_drain_policy() -> None:
    assert SidecarConfig().drain_policy().min_wait_s == 5.0
    assert config_from_mapping({"min_wait_s": "8"}).drain_policy().min_wait_s == 8.0
    assert parse_flags(["--min-wait-s", "0"]).drain_policy().min_wait_s == 0.0
    with pytest.raises(ConfigError, match="min_wait_s must be >= 0"):
        config_from_mapping({"min_wait_s": -1})


def test_the_retired_publish_reserve_says_what_replaced_it() -> None:
    """The publish runs beside the in-flight wait now: a config that still reserves time for
    it fails with the reason, not as a mere unknown key."""
    with pytest.raises(ConfigError, match="publish_reserve_s was retired: the cache publish now runs beside"):
        config_from_mapping({"publish_reserve_s": 15})
    with pytest.raises(ConfigError, match="publish_reserve_s was retired"):
        parse_flags(["--publish-reserve-s", "0"])
    assert not hasattr(SidecarConfig(), "publish_reserve_s")
