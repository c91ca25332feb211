"""Stopping TorchServe's process tree, on real processes."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from handler.torchserve.errors import TorchServeError
from handler.torchserve.stop import read_pid_file, stop_with_cli, terminate_tree

PARENT = textwrap.dedent("""
    import subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    print(child.pid, flush=True)
    time.sleep(60)
""")
STUBBORN = textwrap.dedent("""
    import signal, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print("ignoring", flush=True)
    time.sleep(60)
""")


def spawn(code: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    return proc, proc.stdout.readline().strip()


def test_tree_stopped_with_sigterm() -> None:
    proc, child_pid = spawn(PARENT)
    terminate_tree(proc.pid, timeout_s=5)
    assert proc.wait(timeout=5) == -15
    assert not psutil.pid_exists(int(child_pid)) or \
        psutil.Process(int(child_pid)).status() == psutil.STATUS_ZOMBIE


def test_process_ignoring_sigterm_is_killed_and_reported() -> None:
    proc, _ = spawn(STUBBORN)
    with pytest.raises(TorchServeError, match=r"outlived 0\.3 s and were killed"):
        terminate_tree(proc.pid, timeout_s=0.3)
    assert proc.wait(timeout=5) == -9


# A "JVM" that ignores SIGTERM, with a "worker" running in an unpacked archive, as TorchServe's do.
UNPACKED_WORKER = textwrap.dedent("""
    import signal, subprocess, sys, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], cwd=sys.argv[1])
    print(worker.pid, flush=True)
    time.sleep(60)
""")


def _unpacked(tmp_path: Path) -> Path:
    unpacked = tmp_path / "models" / "71f063a422154c5db43510975c6cedff"
    (unpacked / "MAR-INF").mkdir(parents=True)
    (unpacked / "MAR-INF" / "MANIFEST.json").write_text("{}")
    return unpacked


def test_a_killed_tree_leaves_no_unpacked_archive_behind(tmp_path: Path) -> None:
    unpacked = _unpacked(tmp_path)
    proc = subprocess.Popen([sys.executable, "-c", UNPACKED_WORKER, str(unpacked)], stdout=subprocess.PIPE, text=True)
    proc.stdout.readline()
    with pytest.raises(TorchServeError, match=f"killed; removed {unpacked}"):
        terminate_tree(proc.pid, timeout_s=0.3)
    assert not unpacked.exists()


def test_a_clean_stop_leaves_the_unpacked_archive_to_torchserve(tmp_path: Path) -> None:
    unpacked = _unpacked(tmp_path)
    proc = subprocess.Popen([sys.executable, "-c", UNPACKED_WORKER.replace("signal.SIG_IGN", "signal.SIG_DFL"),
                             str(unpacked)], stdout=subprocess.PIPE, text=True)
    proc.stdout.readline()
    terminate_tree(proc.pid, timeout_s=5)
    assert unpacked.exists()


def test_caller_owned_root_is_waited_by_the_caller() -> None:
    proc, _ = spawn(PARENT)
    waited: list[float] = []

    def wait_root(timeout_s: float) -> bool:
        waited.append(timeout_s)
        return proc.wait(timeout=timeout_s) is not None

    terminate_tree(proc.pid, timeout_s=5, wait_root=wait_root)
    assert waited == [5] and proc.returncode == -15


def test_already_gone_is_fine() -> None:
    proc, _ = spawn(PARENT)
    proc.kill()
    proc.wait()
    terminate_tree(proc.pid, timeout_s=1)


def fake_torchserve(tmp_path: Path, body: str) -> str:
    script = tmp_path / "torchserve"
    script.write_text(f"#!{sys.executable}\nimport sys\n{body}\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


def test_stop_with_cli_passes_foreground(tmp_path: Path) -> None:
    log = tmp_path / "argv"
    exe = fake_torchserve(tmp_path, f"open({str(log)!r}, 'w').write(' '.join(sys.argv[1:]))")
    stop_with_cli(5, executable=exe)
    assert log.read_text() == "--stop --foreground"


def test_stop_with_cli_too_slow_is_an_error(tmp_path: Path) -> None:
    exe = fake_torchserve(tmp_path, "print('Stopping TorchServe took too long.')")
    with pytest.raises(TorchServeError, match="took too long"):
        stop_with_cli(5, executable=exe)


def test_read_pid_file(tmp_path: Path) -> None:
    (tmp_path / "pid").write_text(f"{os.getpid()}\n")
    assert read_pid_file(tmp_path / "pid") == os.getpid()
    with pytest.raises(TorchServeError, match="cannot read a pid"):
        read_pid_file(tmp_path / "missing")
