"""`ts-llm-sidecar` subcommands: watch, drain (the preStop hook), restore, publish."""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
from pathlib import Path

import pytest
import requests

from handler.sidecar.app.cli import main
from handler.sidecar.app.sidecar import Sidecar
from handler.sidecar.config import config_from_mapping
from handler.testing.metadata_emulator import MetadataEmulator
from handler.torchserve.launch import free_port
from tests.support.fake_torchserve import FakeManagement

from ..conftest import cache_key, install_artifact


def watch_flags(emulator: MetadataEmulator, management: FakeManagement, port: int) -> list[str]:
    return ["--aws-metadata-url", emulator.url, "--management-url", management.url,
            "--metrics-url", management.metrics_url, "--listen-host", "127.0.0.1",
            "--listen-port", str(port), "--poll-interval-s", "0.05", "--drain-margin-s", "1",
            "--stop-reserve-s", "1", "--quiet-s", "0.1"]


def wait_for_done_then_sigterm(port: int, seen: list[dict[str, object]]) -> None:
    """What the kubelet does to a native sidecar once the main container has exited."""
    pause = threading.Event()
    while not pause.wait(0.05):
        try:
            status = requests.get(f"http://127.0.0.1:{port}/drain", timeout=2).json()
        except requests.ConnectionError:
            continue  # not listening yet
        if status["state"] == "done":
            seen.append(status)
            os.kill(os.getpid(), signal.SIGTERM)
            return


def test_watch_drains_then_serves_until_sigterm_when_it_does_not_stop_torchserve(
        emulator: MetadataEmulator, management: FakeManagement) -> None:
    port = free_port()
    emulator.raise_spot_interruption(in_seconds=30)
    seen: list[dict[str, object]] = []
    killer = threading.Thread(target=wait_for_done_then_sigterm, args=(port, seen), daemon=True)
    killer.start()
    code = main(["watch", *watch_flags(emulator, management, port), "--stop-method", "none"])
    killer.join(timeout=5)
    assert code == 0
    report = seen[0]["report"]
    assert isinstance(report, dict) and report["exit_code"] == 0
    assert report["notice"]["kind"] == "spot_interruption"


def test_drain_subcommand_starts_the_drain_and_waits_for_it(
        emulator: MetadataEmulator, management: FakeManagement, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    port = free_port()
    flag = tmp_path / "run" / "draining"
    config = config_from_mapping({
        "aws_metadata_url": emulator.url, "management_url": management.url,
        "metrics_url": management.metrics_url, "listen_host": "127.0.0.1", "listen_port": port,
        "poll_interval_s": 0.05, "drain_margin_s": 1,
        "stop_reserve_s": 1, "quiet_s": 0.1, "stop_method": "none", "signal_grace_s": 20,
        "drain_flag_file": str(flag)})
    codes: list[int] = []
    prestop_done = threading.Event()

    def prestop() -> None:
        codes.append(main(["drain", "--wait", "--listen-port", str(port)]))
        prestop_done.set()

    with Sidecar(config) as sidecar:
        hook = threading.Thread(target=prestop, daemon=True)
        hook.start()
        report = sidecar.run(until=prestop_done)
    hook.join(timeout=5)
    assert codes == [0]
    assert report is not None and report.notice.kind.value == "drain_request"
    assert 15 < report.plan.budget_s <= 20  # signal_grace_s is the preStop deadline
    assert flag.exists(), "close_admission creates the handler's drain flag"
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed["state"] == "done" and printed["report"]["exit_code"] == 0


def test_second_drain_request_joins_the_first(emulator: MetadataEmulator,
                                              management: FakeManagement) -> None:
    config = config_from_mapping({
        "aws_metadata_url": emulator.url, "management_url": management.url,
        "metrics_url": management.metrics_url, "listen_host": "127.0.0.1", "listen_port": 0,
        "stop_method": "none"})
    with Sidecar(config) as sidecar:
        url = f"http://127.0.0.1:{sidecar.http.port}/drain"
        assert requests.get(url, timeout=2).json()["state"] == "idle"
        first = requests.post(url, timeout=2)
        second = requests.post(url, timeout=2)
    assert (first.status_code, first.json()["state"]) == (202, "draining")
    assert (second.status_code, second.json()["state"]) == (200, "draining")


def test_drain_without_a_sidecar_says_what_to_check(caplog) -> None:
    with caplog.at_level(logging.ERROR):
        assert main(["drain", "--wait", "--listen-port", str(free_port())]) == 1
    assert "is `ts-llm-sidecar watch` running" in caplog.text


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


def compiled_cache(cache_dir: Path) -> None:
    """A compile cache as a worker's cold compile installs it: artifacts, cache-key.json and
    the manifest."""
    install_artifact(cache_dir)


def test_publish_then_restore_round_trip_through_handler_cache(tmp_path: Path) -> None:
    src, dest, store = tmp_path / "compiled", tmp_path / "restored", str(tmp_path / "store")
    compiled_cache(src)
    assert main(["publish", "--cache-store", store, "--cache-dir", str(src)]) == 0
    assert main(["restore", "--model-name", "llm", "--cache-store", store, "--cache-dir",
                 str(dest), "--cache-key", str(src / "cache-key.json")]) == 0
    assert (dest / "a.bin").read_bytes() == (src / "a.bin").read_bytes()
    assert (dest / "sub" / "b.json").read_text() == '{"graph": 1}'
    # The key travels with the artifacts, so the restored replica's drain finds it.
    assert (dest / "cache-key.json").exists()


def test_restore_leaves_a_record_for_the_sidecar_metrics(tmp_path: Path) -> None:
    src, dest, store = tmp_path / "compiled", tmp_path / "cache" / "aot", str(tmp_path / "store")
    compiled_cache(src)
    assert main(["publish", "--cache-store", store, "--cache-dir", str(src)]) == 0
    key = str(src / "cache-key.json")
    assert main(["restore", "--cache-store", store, "--cache-dir", str(dest),
                 "--cache-key", key]) == 0
    record = json.loads((tmp_path / "cache" / ".aot.restore.json").read_text())
    assert (record["outcome"], record["downloads"], record["rejected"]) == ("restored", 1, 0)
    assert sorted(p.name for p in dest.iterdir()) == sorted(p.name for p in src.iterdir()), \
        "the record is beside the artifact, never inside it"
    assert main(["restore", "--cache-store", str(tmp_path / "empty-store"), "--cache-dir",
                 str(dest), "--cache-key", key]) == 0
    record = json.loads((tmp_path / "cache" / ".aot.restore.json").read_text())
    assert (record["outcome"], record["downloads"]) == ("already_local", 0)


def publish_errors(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno >= logging.ERROR]


def assert_one_line_error(caplog, *expected: str) -> None:
    (record,) = publish_errors(caplog)
    message = record.getMessage()
    assert record.exc_info is None and "\n" not in message, "one line, no traceback"
    assert message.startswith("cache publish: ")
    for text in expected:
        assert text in message, message


@pytest.mark.parametrize("with_key_file", [True, False])
def test_publish_of_an_empty_cache_dir_is_a_one_line_error(
        tmp_path: Path, caplog, with_key_file: bool) -> None:
    cache, key_path = tmp_path / "aot", tmp_path / "key.json"
    cache.mkdir()
    key_path.write_text(json.dumps(cache_key().describe()))
    if with_key_file:  # what the pod's key step leaves there when the restore missed
        (cache / "cache-key.json").write_text(key_path.read_text())
    flags = ["--cache-store", str(tmp_path / "store"), "--cache-dir", str(cache)]
    with caplog.at_level(logging.INFO):
        code = main(["publish", *flags, *([] if with_key_file else ["--cache-key", str(key_path)])])
    assert code == 1
    assert_one_line_error(caplog, f"no artifact in {cache}", "no files besides cache-key.json",
                          "nothing to publish")
    assert not (tmp_path / "store").exists() or not any((tmp_path / "store").rglob("*.json"))


def test_publish_of_a_directory_without_a_manifest_uploads_its_files(tmp_path: Path) -> None:
    """A cache dir filled by hand (files and cache-key.json, no manifest) is published as is."""
    cache = pytest.importorskip("handler.cache")
    src = tmp_path / "compiled"
    (src / "sub").mkdir(parents=True)
    key = cache_key()
    (src / "cache-key.json").write_text(json.dumps(key.describe()))
    (src / "sub" / "kernel.so").write_bytes(b"\x7fELF" * 64)
    assert main(["publish", "--cache-store", str(tmp_path / "store"), "--cache-dir",
                 str(src)]) == 0
    store = cache.LocalStore(tmp_path / "store")
    assert store.exists(key)
    store.fetch(key, tmp_path / "restored")
    assert (tmp_path / "restored" / "sub" / "kernel.so").read_bytes() == b"\x7fELF" * 64


def test_publish_of_a_cache_dir_with_a_symlink_is_a_one_line_error(tmp_path: Path,
                                                                    caplog) -> None:
    cache = tmp_path / "aot"
    install_artifact(cache)
    (tmp_path / "elsewhere").write_text("secret")
    (cache / "sub" / "link").symlink_to(tmp_path / "elsewhere")
    with caplog.at_level(logging.INFO):
        assert main(["publish", "--cache-store", str(tmp_path / "store"), "--cache-dir",
                     str(cache)]) == 1
    assert_one_line_error(caplog, "symlinks cannot be part of an artifact", "not published")
    assert not (tmp_path / "store").exists()


def test_publish_refuses_an_artifact_of_another_key(tmp_path: Path, caplog) -> None:
    cache = tmp_path / "aot"
    theirs = install_artifact(cache, cache_key(torch_version="2.14.0"), key_file=False)
    ours = cache_key()
    (tmp_path / "key.json").write_text(json.dumps(ours.describe()))
    with caplog.at_level(logging.INFO):
        assert main(["publish", "--cache-store", str(tmp_path / "store"), "--cache-dir",
                     str(cache), "--cache-key", str(tmp_path / "key.json")]) == 1
    assert_one_line_error(caplog, f"built for key {theirs.digest()}", ours.digest())


@pytest.mark.parametrize("damage, expected", [
    (lambda cache: (cache / "stray.txt").write_text("x"), "stray.txt is not in it"),
    (lambda cache: (cache / "a.bin").unlink(), "a.bin is missing from it"),
    (lambda cache: (cache / "a.bin").write_bytes(b"short"), "a.bin: size 5 != 600"),
])
def test_publish_refuses_a_cache_dir_that_differs_from_its_manifest(
        tmp_path: Path, caplog, damage, expected: str) -> None:
    cache = tmp_path / "aot"
    install_artifact(cache)
    damage(cache)
    with caplog.at_level(logging.INFO):
        assert main(["publish", "--cache-store", str(tmp_path / "store"), "--cache-dir",
                     str(cache)]) == 1
    assert_one_line_error(caplog, "does not match its manifest", expected)


def test_no_key_file_is_a_cold_start_not_an_error(tmp_path: Path, caplog) -> None:
    with caplog.at_level(logging.WARNING):
        assert main(["restore", "--cache-store", str(tmp_path / "s"), "--cache-dir",
                     str(tmp_path / "empty")]) == 0
        assert main(["publish", "--cache-store", str(tmp_path / "s"), "--cache-dir",
                     str(tmp_path / "empty")]) == 0
    assert "no cache key at" in caplog.text


def test_restore_without_a_store_exits_2_naming_the_flags(tmp_path: Path, caplog) -> None:
    with caplog.at_level(logging.ERROR):
        assert main(["restore", "--cache-dir", str(tmp_path)]) == 2
    assert "--cache-store" in caplog.text


def test_bad_key_file_exits_2(tmp_path: Path, caplog) -> None:
    (tmp_path / "cache-key.json").write_text('{"torch": "2"}')
    with caplog.at_level(logging.ERROR):
        assert main(["restore", "--cache-store", str(tmp_path / "s"), "--cache-dir",
                     str(tmp_path)]) == 2
    assert "is not a cache key file" in caplog.text


def test_watch_refuses_restore_at_start(tmp_path: Path, caplog) -> None:
    with caplog.at_level(logging.ERROR):
        assert main(["watch", "--cache-store", str(tmp_path / "s"), "--cache-dir", str(tmp_path / "aot"),
                     "--restore-at-start", "true"]) == 2
    assert "entrypoint" in caplog.text
