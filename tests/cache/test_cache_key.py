from __future__ import annotations

import sys
from importlib import metadata
from pathlib import Path

import pytest
import torch

from handler.cache import key as key_mod
from handler.cache.key import current_key, digest_files, sha256_json

CONFIG = {"max_batch": 4, "max_seq": 2048, "compile": {"mode": "max-autotune", "dynamic": True}}


def _key(config: dict = CONFIG, weights: str = "ab" * 32):
    return current_key(weights, config, "cpu", version="0.0.0")


def test_key_is_stable_for_the_same_inputs():
    assert _key().digest() == _key().digest()
    assert _key() == _key()


def test_key_changes_with_torch_version(monkeypatch):
    before = _key()
    monkeypatch.setattr(torch, "__version__", "2.99.0")
    after = _key()
    assert after.torch_version == "2.99.0"
    assert after.digest() != before.digest()


def test_key_changes_with_config_but_not_key_order():
    reordered = {"compile": {"dynamic": True, "mode": "max-autotune"}, "max_seq": 2048, "max_batch": 4}
    assert _key(reordered).digest() == _key().digest()
    assert _key({**CONFIG, "max_batch": 8}).digest() != _key().digest()


def test_key_changes_with_weights(tmp_path: Path):
    shard = tmp_path / "model.safetensors"
    shard.write_bytes(b"\x00" * 4096)
    before = _key(weights=digest_files([shard]))
    shard.write_bytes(b"\x00" * 4095 + b"\x01")
    assert _key(weights=digest_files([shard])).digest() != before.digest()


def test_digest_files_ignores_location_and_order(tmp_path: Path):
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "1.bin").write_bytes(b"one")
        (tmp_path / d / "2.bin").write_bytes(b"two")
    a = [tmp_path / "a" / "1.bin", tmp_path / "a" / "2.bin"]
    b = [tmp_path / "b" / "2.bin", tmp_path / "b" / "1.bin"]
    assert digest_files(a) == digest_files(b)


def test_digest_files_sees_swapped_shards(tmp_path: Path):
    (tmp_path / "1.bin").write_bytes(b"one")
    (tmp_path / "2.bin").write_bytes(b"two")
    before = digest_files([tmp_path / "1.bin", tmp_path / "2.bin"])
    (tmp_path / "1.bin").write_bytes(b"two")
    (tmp_path / "2.bin").write_bytes(b"one")
    assert digest_files([tmp_path / "1.bin", tmp_path / "2.bin"]) != before


def test_triton_version_is_none_when_not_importable(monkeypatch):
    monkeypatch.setitem(sys.modules, "triton", None)  # makes `import triton` raise ImportError
    assert key_mod.triton_version() == "none"


def test_cpu_capability_names_the_isa():
    device_type, capability = key_mod.device_capability("cpu")
    assert device_type == "cpu"
    assert torch.backends.cpu.get_cpu_capability() in capability


def test_unsupported_device_is_refused():
    with pytest.raises(ValueError, match="unsupported device"):
        key_mod.device_capability("meta")


def _not_installed(name: str) -> str:
    raise metadata.PackageNotFoundError(name)


def test_package_version_falls_back_to_the_callers_version(monkeypatch):
    monkeypatch.setattr(metadata, "version", _not_installed)
    assert key_mod.package_version("1.2.3") == "1.2.3"
    with pytest.raises(metadata.PackageNotFoundError, match="pass version="):
        key_mod.package_version()


def test_describe_carries_every_field_and_the_digest():
    k = _key()
    d = k.describe()
    assert d["digest"] == k.digest()
    assert d["config_digest"] == sha256_json(CONFIG)
    assert {"torch_version", "triton_version", "device_type", "device_capability", "weights_digest",
            "package_version", "schema"} <= d.keys()
