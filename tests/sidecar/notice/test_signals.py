"""SIGTERM/SIGINT become notices with deadline = received + grace."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from handler.sidecar.notice.signals import SignalWatcher
from handler.sidecar.notice.termination import NoticeKind

REPO = Path(__file__).resolve().parents[3]

CHILD = textwrap.dedent("""
    import json, time
    from handler.sidecar.notice.signals import SignalWatcher
    watcher = SignalWatcher(clock=time.time, grace_s=12.5)
    watcher.install()
    print("ready", flush=True)
    notice = watcher.poll(timeout_s=20)
    print(json.dumps({"notice": notice.to_json(), "after": time.time()}), flush=True)
""")


def test_real_sigterm_in_a_subprocess_becomes_a_notice() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True,
                            env=env, cwd=REPO)
    try:
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGTERM)
        result = json.loads(proc.stdout.readline())
        assert proc.wait(timeout=10) == 0  # handled: the default action would kill it
    finally:
        proc.kill()
        proc.wait()
    notice = result["notice"]
    assert notice["kind"] == "signal" and notice["detail"] == {"signal": "SIGTERM"}
    assert 0 < result["after"] + 12.5 - notice["deadline_epoch"] < 5


def test_handler_records_time_of_receipt(clock) -> None:
    watcher = SignalWatcher(clock=clock, grace_s=30.0)
    watcher.handle(signal.SIGINT)
    clock.advance(3.0)  # polled later: the deadline still counts from receipt
    notice = watcher.poll()
    assert notice.kind is NoticeKind.SIGNAL and notice.detail["signal"] == "SIGINT"
    assert notice.deadline_epoch == clock() - 3.0 + 30.0


def test_no_signal_no_notice(clock) -> None:
    assert SignalWatcher(clock=clock, grace_s=30.0).poll() is None


def test_restore_puts_back_the_previous_handlers(clock) -> None:
    before = signal.getsignal(signal.SIGTERM)
    watcher = SignalWatcher(clock=clock, grace_s=30.0, signals=(signal.SIGTERM,))
    watcher.install()
    assert signal.getsignal(signal.SIGTERM) == watcher.handle
    watcher.restore()
    assert signal.getsignal(signal.SIGTERM) == before
