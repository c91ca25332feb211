"""`ts-llm-sidecar` subcommands."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import pytest

from handler.sidecar.cli import main
from handler.sidecar.emulator import MetadataEmulator

from .conftest import FakeManagement


def test_watch_drains_on_notice_and_exits_0(emulator: MetadataEmulator,
                                            management: FakeManagement) -> None:
    emulator.raise_spot_interruption(in_seconds=30)
    code = main(["watch", "--aws-metadata-url", emulator.url, "--management-url",
                 management.url, "--listen-host", "127.0.0.1", "--listen-port", "0",
                 "--poll-interval-s", "0.05", "--stop-method", "none", "--margin-s", "1",
                 "--publish-reserve-s", "0", "--stop-reserve-s", "1", "--quiet-s", "0.1"])
    assert code == 0


def test_unknown_config_key_exits_2_naming_it(tmp_path: Path, caplog) -> None:
    path = tmp_path / "sidecar.yaml"
    path.write_text("stop_methd: none\n")
    with caplog.at_level(logging.ERROR):
        assert main(["watch", "--config", str(path)]) == 2
    assert "unknown key 'stop_methd'" in caplog.text


def test_unknown_flag_is_an_argparse_error() -> None:
    with pytest.raises(SystemExit) as raised:
        main(["watch", "--margin-secs", "3"])
    assert raised.value.code == 2


def cache_fixture(tmp_path: Path) -> tuple[Path, Path]:
    """A key file as CacheKey.describe() writes it, and a directory of compiled artifacts."""
    cache = pytest.importorskip("handler.cache")
    key = cache.CacheKey(torch_version="2.13.0", triton_version="none", device_type="cpu",
                         device_capability="x86_64", weights_digest="w" * 16,
                         config_digest="c" * 16, package_version="0.1.0")
    key_file = tmp_path / "cache_key.json"
    key_file.write_text(json.dumps(key.describe()))
    src = tmp_path / "compiled"
    (src / "sub").mkdir(parents=True)
    (src / "a.bin").write_bytes(b"kernel" * 100)
    (src / "sub" / "b.json").write_text('{"graph": 1}')
    return key_file, src


def test_publish_then_restore_round_trip_through_handler_cache(tmp_path: Path) -> None:
    key_file, src = cache_fixture(tmp_path)
    store, dest = str(tmp_path / "store"), tmp_path / "restored"
    assert main(["publish", "--store", store, "--key", str(key_file), "--src-dir",
                 str(src)]) == 0
    assert main(["restore", "--store", store, "--key", str(key_file), "--dest-dir",
                 str(dest)]) == 0
    assert (dest / "a.bin").read_bytes() == (src / "a.bin").read_bytes()
    assert (dest / "sub" / "b.json").read_text() == '{"graph": 1}'


def test_bad_key_file_exits_2(tmp_path: Path, caplog) -> None:
    (tmp_path / "key.json").write_text('{"torch": "2"}')
    with caplog.at_level(logging.ERROR):
        assert main(["restore", "--store", str(tmp_path / "s"), "--key",
                     str(tmp_path / "key.json"), "--dest-dir", str(tmp_path / "d")]) == 2
    assert "is not a cache key file" in caplog.text


def test_missing_cache_package_exits_2(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                       caplog) -> None:
    monkeypatch.setitem(sys.modules, "handler.cache", None)
    with caplog.at_level(logging.ERROR):
        assert main(["restore", "--store", "s3://b/p", "--key", "k", "--dest-dir",
                     str(tmp_path)]) == 2
    assert "handler.cache.sync is not available" in caplog.text
