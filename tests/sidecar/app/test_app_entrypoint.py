"""The container entrypoint, as a real process tree: entrypoint -> fake TorchServe child."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import requests

from handler.sidecar.app.entrypoint import parse
from handler.sidecar.errors import ConfigError
from handler.testing.metadata_emulator import MetadataEmulator
from tests.support.fake_torchserve import FakeManagement

from ..conftest import install_artifact

REPO = Path(__file__).resolve().parents[3]

# Stands in for `torchserve --start --foreground`: up until SIGTERM, then a clean exit.
CHILD = textwrap.dedent("""
    import signal, sys, time
    def stop(signum, frame):
        print("child got SIGTERM", flush=True)
        sys.exit(0)
    signal.signal(signal.SIGTERM, stop)
    print("child up", flush=True)
    time.sleep(60)
""")


def start(emulator: MetadataEmulator, management: FakeManagement,
          child: str = CHILD, extra: tuple[str, ...] = ()) -> subprocess.Popen[str]:
    flags = [*extra, "--clouds", "aws", "--aws-metadata-url", emulator.url,
             "--management-url", management.url, "--metrics-url", management.metrics_url,
             "--listen-host", "127.0.0.1",
             "--listen-port", "0", "--poll-interval-s", "0.05", "--drain-margin-s", "1",
             "--stop-reserve-s", "2", "--quiet-s", "0.1"]
    return subprocess.Popen(
        [sys.executable, "-m", "handler.sidecar.app.entrypoint", *flags, "--",
         sys.executable, "-c", child],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)})


def finish(proc: subprocess.Popen[str]) -> tuple[int, str, dict[str, object] | None]:
    try:
        out, err = proc.communicate(timeout=20)
    finally:
        proc.kill()
    reports = [json.loads(line[line.index("{"):]) for line in err.splitlines()
               if '"event": "drain_report"' in line]
    return proc.returncode, out, reports[0] if reports else None


def test_spot_notice_drains_and_stops_the_child(emulator: MetadataEmulator,
                                                management: FakeManagement) -> None:
    proc = start(emulator, management)
    assert proc.stdout.readline().strip() == "child up"
    requests.post(emulator.url + "/_control/spot", json={"in_seconds": 30},
                  timeout=2).raise_for_status()
    code, out, report = finish(proc)
    assert code == 0 and "child got SIGTERM" in out
    assert report["notice"]["kind"] == "spot_interruption" and report["stopped"] is True


def test_sigterm_to_the_entrypoint_runs_the_drain(emulator: MetadataEmulator,
                                                  management: FakeManagement) -> None:
    proc = start(emulator, management)
    assert proc.stdout.readline().strip() == "child up"
    proc.send_signal(signal.SIGTERM)
    code, out, report = finish(proc)
    assert code == 0 and "child got SIGTERM" in out
    assert report["notice"]["detail"] == {"signal": "SIGTERM"}
    assert [step["name"] for step in report["steps"]] == ["not_ready", "wait_in_flight", "close_listeners", "stop"]
    assert report["listeners_closed"] == []  # this child listens on nothing


# Listens like TorchServe's frontend; at SIGTERM it reports whether its listener still accepts.
LISTENING_CHILD = textwrap.dedent("""
    import signal, socket, sys, time
    listener = socket.create_server(("127.0.0.1", 0))
    def stop(signum, frame):
        try:
            socket.create_connection(listener.getsockname(), timeout=1).close()
            print("listener still accepting at SIGTERM", flush=True)
        except ConnectionRefusedError:
            print("listener shut before SIGTERM", flush=True)
        sys.exit(0)
    signal.signal(signal.SIGTERM, stop)
    print("child up", listener.getsockname()[1], flush=True)
    time.sleep(60)
""")


def test_the_drain_shuts_the_childs_listeners_before_sigterm(emulator: MetadataEmulator,
                                                             management: FakeManagement) -> None:
    proc = start(emulator, management, child=LISTENING_CHILD)
    port = int(proc.stdout.readline().split()[-1])
    proc.send_signal(signal.SIGTERM)
    code, out, report = finish(proc)
    assert code == 0 and "listener shut before SIGTERM" in out
    assert report["listeners_closed"] == [port]


def test_listeners_stay_open_when_close_listeners_is_off(emulator: MetadataEmulator,
                                                        management: FakeManagement) -> None:
    proc = start(emulator, management, child=LISTENING_CHILD, extra=("--close-listeners", "false"))
    proc.stdout.readline()
    proc.send_signal(signal.SIGTERM)
    code, out, report = finish(proc)
    assert code == 0 and "listener still accepting at SIGTERM" in out
    assert "close_listeners" not in [step["name"] for step in report["steps"]]


def test_child_exiting_on_its_own_passes_its_code_through(emulator: MetadataEmulator,
                                                          management: FakeManagement) -> None:
    proc = start(emulator, management, child="import sys; print('child up'); sys.exit(3)")
    code, _, report = finish(proc)
    assert code == 3 and report is None


def test_restore_at_start_is_done_before_the_child_looks(emulator: MetadataEmulator,
                                                        management: FakeManagement, tmp_path: Path) -> None:
    from handler.sidecar.app.cli import main as cli

    src, dest, store = tmp_path / "compiled", tmp_path / "cache" / "aot", str(tmp_path / "store")
    install_artifact(src)
    assert cli(["publish", "--cache-store", store, "--cache-dir", str(src)]) == 0
    # The child looks under the install lock, as a TorchServe worker does (artifacts.holding).
    child = textwrap.dedent(f"""
        from pathlib import Path
        from handler.cache.install import install_lock
        dest = Path({str(dest)!r})
        with install_lock(dest):
            print("child saw", sorted(p.name for p in dest.iterdir()) if dest.exists() else None, flush=True)
    """)
    proc = start(emulator, management, child, ("--cache-store", store, "--cache-dir", str(dest),
                                               "--cache-key", str(src / "cache-key.json"),
                                               "--restore-at-start", "true"))
    code, out, _ = finish(proc)
    assert code == 0, out
    assert "'a.bin'" in out and "'cache-key.json'" in out, out
    assert json.loads((tmp_path / "cache" / ".aot.restore.json").read_text())["outcome"] == "restored"


def test_restore_at_start_with_a_bad_key_file_is_a_config_error(emulator: MetadataEmulator,
                                                                management: FakeManagement, tmp_path: Path) -> None:
    (tmp_path / "key.json").write_text("not json")
    proc = start(emulator, management, extra=("--cache-store", str(tmp_path / "store"), "--cache-dir",
                                              str(tmp_path / "aot"), "--cache-key", str(tmp_path / "key.json"),
                                              "--restore-at-start", "true"))
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == 2 and "child up" not in out
    assert "is not a cache key file" in err


def test_a_failed_restore_at_start_is_logged_and_torchserve_still_starts(emulator: MetadataEmulator,
                                                                         management: FakeManagement,
                                                                         tmp_path: Path) -> None:
    src, store = tmp_path / "compiled", str(tmp_path / "store")
    install_artifact(src)
    (tmp_path / "not-a-dir").write_text("")  # the cache dir's parent is a file: the restore cannot write
    proc = start(emulator, management, "print('child up')",
                 ("--cache-store", store, "--cache-dir", str(tmp_path / "not-a-dir" / "aot"),
                  "--cache-key", str(src / "cache-key.json"), "--restore-at-start", "true"))
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0 and "child up" in out
    assert "cache restore failed" in err and "TorchServe will compile cold" in err


def test_restore_at_start_needs_a_store() -> None:
    with pytest.raises(ConfigError, match="restore_at_start needs cache_store"):
        parse(["--restore-at-start", "true", "--", "torchserve", "--start"])


def test_torchserve_start_gets_foreground_and_the_key_file() -> None:
    config, command = parse(["--model-name", "llm", "--", "torchserve", "--start",
                             "--ts-config", "config.properties"])
    assert command[-1] == "--foreground" and config.key_file == "key_file.json"


def test_torchserve_start_gets_its_model_log_read_for_readiness(monkeypatch) -> None:
    monkeypatch.delenv("LOG_LOCATION", raising=False)
    config, _ = parse(["--", "torchserve", "--start"])
    assert config.model_log == "logs/model_log.log"
    monkeypatch.setenv("LOG_LOCATION", "/srv/logs")
    assert parse(["--", "torchserve", "--start"])[0].model_log == "/srv/logs/model_log.log"


def test_token_auth_disabled_means_no_key_file() -> None:
    config, _ = parse(["--", "torchserve", "--start", "--foreground", "--disable-token-auth"])
    assert config.key_file is None


def test_command_is_required() -> None:
    with pytest.raises(ConfigError, match="--"):
        parse(["--model-name", "llm"])


def test_key_file_from_the_config_file_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "sidecar.yaml"
    path.write_text("key_file: /srv/ts/key_file.json\n")
    config, _ = parse(["--config", str(path), "--", "torchserve", "--start"])
    assert config.key_file == "/srv/ts/key_file.json"
