"""GCP preemption watcher: a read, then long-polls that return when the value changes."""

from __future__ import annotations

import random
import threading
import time

import pytest

from handler.sidecar.errors import MetadataError
from handler.sidecar.notice.gcp import GcpWatcher
from handler.sidecar.notice.termination import NoticeKind
from handler.testing.metadata_emulator import MetadataEmulator


def watcher(url: str, clock=time.time, **kw) -> GcpWatcher:
    return GcpWatcher(url, clock=clock, rng=random.Random(3), sleep=lambda s: None,
                      timeout_s=1.0, **kw)


def test_not_preempted_first_read_is_immediate(emulator: MetadataEmulator) -> None:
    started = time.monotonic()
    assert watcher(emulator.url, wait_timeout_s=10).poll() is None
    assert time.monotonic() - started < 1.0


def test_long_poll_wakes_on_preemption(emulator: MetadataEmulator, clock) -> None:
    gcp = watcher(emulator.url, clock=clock, wait_timeout_s=20, notice_s=30.0)
    assert gcp.poll() is None  # the read that takes the ETag
    in_long_poll = threading.Timer(0.2, emulator.preempt_gcp)
    in_long_poll.start()
    started = time.monotonic()
    notice = gcp.poll()
    elapsed = time.monotonic() - started
    assert notice is not None and 0.15 < elapsed < 5  # it blocked, and woke long before 20 s
    assert notice.kind is NoticeKind.PREEMPTION and notice.source == "gcp"
    assert notice.deadline_epoch == clock() + 30.0


def test_preemption_before_the_first_poll_is_not_missed(emulator: MetadataEmulator) -> None:
    emulator.preempt_gcp()
    assert watcher(emulator.url, wait_timeout_s=20).poll() is not None


def test_long_poll_timeout_means_no_notice(emulator: MetadataEmulator) -> None:
    gcp = watcher(emulator.url, wait_timeout_s=0)
    gcp.poll()
    assert gcp.poll() is None


def test_reported_once(emulator: MetadataEmulator) -> None:
    emulator.preempt_gcp()
    gcp = watcher(emulator.url)
    assert gcp.poll() is not None
    assert gcp.poll() is None


def test_503_is_retried(emulator: MetadataEmulator) -> None:
    emulator.preempt_gcp()
    emulator.inject_fault(2, status=503)
    assert watcher(emulator.url).poll() is not None


def test_403_is_an_error_not_a_false(emulator: MetadataEmulator) -> None:
    emulator.inject_fault(1, status=403)
    with pytest.raises(MetadataError, match="403"):
        watcher(emulator.url).poll()
