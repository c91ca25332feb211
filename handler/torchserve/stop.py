"""Stopping TorchServe: `torchserve --stop`, a pid, or a whole process tree.

`torchserve --start --foreground` is a Python wrapper that Popens the JVM and waits on it;
SIGTERM to the wrapper alone would orphan the JVM, so trees are stopped from the top down:
SIGTERM to the root and its direct children (the JVM runs its shutdown hook, which stops the
Python workers), then SIGKILL for whatever outlives the timeout.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import psutil

from handler.torchserve.errors import TorchServeError


def stop_with_cli(timeout_s: float, executable: str = "torchserve", cwd: Path | None = None,
                  env: dict[str, str] | None = None) -> None:
    """`torchserve --stop`: it finds the server through ts.pid in its temp dir (TMPDIR of `env`)."""
    # --foreground makes --stop wait (up to 60 s) for the frontend to exit instead of
    # returning as soon as the signal is sent.
    done = subprocess.run([executable, "--stop", "--foreground"], capture_output=True, cwd=cwd, env=env,
                          text=True, timeout=timeout_s, check=False)
    if done.returncode != 0 or "took too long" in done.stdout:
        raise TorchServeError(f"torchserve --stop: rc={done.returncode} {done.stdout.strip()}")


def read_pid_file(path: Path) -> int:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError) as err:
        raise TorchServeError(f"cannot read a pid from {path}: {err}") from err


def stop_pid(pid: int, timeout_s: float) -> None:
    terminate_tree(pid, timeout_s)


def terminate_tree(root_pid: int, timeout_s: float,
                   wait_root: Callable[[float], bool] | None = None) -> None:
    """SIGTERM the tree under `root_pid`, SIGKILL what is left after `timeout_s`.

    `wait_root(timeout) -> exited` lets the caller that owns the root (and reaps it with
    Popen.wait) do the waiting, so two reapers never race for the same exit status.
    Raises TorchServeError when anything had to be killed; a killed JVM cannot remove the model
    archives it unpacked, so they are removed here (the workers' working directories).
    """
    try:
        root = psutil.Process(root_pid)
        descendants = root.children(recursive=True)
        top = [root, *root.children()]
    except psutil.NoSuchProcess:
        return
    unpacked = unpacked_archives(descendants)
    _signal(top, signal.SIGTERM)
    give_up_at = time.monotonic() + timeout_s
    root_gone = wait_root(timeout_s) if wait_root else not _wait_gone([root], timeout_s)
    alive = _wait_gone(descendants, give_up_at - time.monotonic())
    if root_gone and not alive:
        return
    doomed = alive if root_gone else [root, *alive]
    _signal(doomed, signal.SIGKILL)
    if not root_gone and wait_root is not None:
        wait_root(2.0)
    _wait_gone(doomed, 2.0)
    removed = _remove(unpacked)
    raise TorchServeError(f"{len(alive) + (not root_gone)} process(es) outlived "
                          f"{timeout_s:.1f} s and were killed" + (f"; removed {removed}" if removed else ""))


def unpacked_archives(processes: Iterable[psutil.Process]) -> list[Path]:
    """The model archives TorchServe unpacked for these workers: a worker runs in its model's
    unpack directory, <java.io.tmpdir>/models/<id>, which holds MAR-INF/MANIFEST.json."""
    found = set()
    for process in processes:
        try:
            cwd = Path(process.cwd())
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if cwd.parent.name == "models" and (cwd / "MAR-INF" / "MANIFEST.json").is_file():
            found.add(cwd)
    return sorted(found)


def _remove(paths: list[Path]) -> str:
    done = []
    for path in paths:
        try:
            shutil.rmtree(path)
            done.append(str(path))
        except OSError as err:
            done.append(f"NOT {path} ({err.strerror})")
    return ", ".join(done)


def _wait_gone(processes: list[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    """Those still running after `timeout_s`. A zombie counts as gone: reaping orphans is
    PID 1's job, and a PID 1 that never reaps must not make every stop look like a failure."""
    give_up_at = time.monotonic() + max(timeout_s, 0.0)
    alive = [process for process in processes if _running(process)]
    while alive and time.monotonic() < give_up_at:
        time.sleep(0.05)
        alive = [process for process in alive if _running(process)]
    return alive


def _running(process: psutil.Process) -> bool:
    try:
        return bool(process.status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


def _signal(processes: Iterable[psutil.Process], sig: signal.Signals) -> None:
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):  # already gone: what we wanted
            process.send_signal(sig)
