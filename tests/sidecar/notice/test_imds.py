"""IMDSv2 watcher against the real emulator over loopback HTTP."""

from __future__ import annotations

import random
import threading
import time

import pytest

from handler.sidecar.errors import ConfigError, MetadataError, MetadataUnavailable
from handler.sidecar.notice.imds import ImdsWatcher
from handler.sidecar.notice.retry import Backoff
from handler.sidecar.notice.termination import NoticeKind, parse_rfc3339
from handler.sidecar.notice.watcher import run_watcher
from handler.testing.metadata_emulator import MetadataEmulator


def watcher(url: str, clock=time.time, sleeps: list[float] | None = None, **kw) -> ImdsWatcher:
    record = sleeps if sleeps is not None else []
    return ImdsWatcher(url, clock=clock, rng=random.Random(7), sleep=record.append,
                       timeout_s=kw.pop("timeout_s", 1.0), **kw)


def test_no_interruption_is_404_and_no_notice(emulator: MetadataEmulator) -> None:
    assert watcher(emulator.url).poll() is None


def test_instance_action_becomes_a_notice_with_its_deadline(emulator: MetadataEmulator) -> None:
    raised = emulator.raise_spot_interruption("terminate", in_seconds=90)
    notice = watcher(emulator.url).poll()
    assert notice is not None and notice.kind is NoticeKind.SPOT_INTERRUPTION
    assert notice.source == "aws" and notice.detail["action"] == "terminate"
    assert notice.deadline_epoch == parse_rfc3339(raised["time"])


def test_a_notice_is_reported_once(emulator: MetadataEmulator) -> None:
    emulator.raise_spot_interruption()
    imds = watcher(emulator.url)
    assert imds.poll() is not None
    assert imds.poll() is None


def test_rebalance_recommendation_is_an_advisory_notice(emulator: MetadataEmulator) -> None:
    emulator.raise_rebalance()
    notice = watcher(emulator.url).poll()
    assert notice is not None and notice.kind is NoticeKind.REBALANCE
    assert "noticeTime" in notice.detail


def test_one_token_serves_many_polls(emulator: MetadataEmulator) -> None:
    imds = watcher(emulator.url)
    for _ in range(5):
        imds.poll()
    assert emulator.state.token_puts == 1


def test_revoked_token_401_fetches_a_new_one(emulator: MetadataEmulator) -> None:
    imds = watcher(emulator.url)
    imds.poll()
    emulator.revoke_tokens()
    emulator.raise_spot_interruption()
    assert imds.poll() is not None
    assert emulator.state.token_puts == 2
    assert ("GET", "/latest/meta-data/spot/instance-action", 401) in emulator.state.requests


def test_token_refreshed_before_its_ttl_runs_out(emulator_with_clock) -> None:
    emulator, clock = emulator_with_clock
    imds = watcher(emulator.url, clock=clock, token_ttl_s=120)
    imds.poll()
    clock.advance(95)  # 25 s left: inside the refresh window (min(60, ttl/4) = 30 s)
    imds.poll()
    assert emulator.state.token_puts == 2
    assert not any(status == 401 for _, _, status in emulator.state.requests)


def test_token_expired_on_the_server_side_is_replaced(emulator_with_clock) -> None:
    """The watcher's clock can disagree with IMDS's; a 401 must still recover."""
    emulator, server_clock = emulator_with_clock
    imds = watcher(emulator.url, clock=lambda: 0.0, token_ttl_s=120)  # never thinks it expired
    imds.poll()
    server_clock.advance(121)
    emulator.raise_spot_interruption()
    assert imds.poll() is not None
    assert emulator.state.token_puts == 2


def test_5xx_retried_with_jittered_backoff_then_succeeds(emulator: MetadataEmulator) -> None:
    sleeps: list[float] = []
    emulator.raise_spot_interruption()
    emulator.inject_fault(2, status=503)
    notice = watcher(emulator.url, sleeps=sleeps, backoff=Backoff(attempts=4, base_s=0.2)).poll()
    assert notice is not None
    expected = random.Random(7)
    assert sleeps == [expected.uniform(0, 0.2), expected.uniform(0, 0.4)]


def test_retries_exhausted_raise_metadata_unavailable(emulator: MetadataEmulator) -> None:
    emulator.inject_fault(10, status=500)
    with pytest.raises(MetadataUnavailable, match="gave up after 3 tries"):
        watcher(emulator.url, backoff=Backoff(attempts=3)).poll()


def test_timeout_is_retried_not_fatal(emulator: MetadataEmulator) -> None:
    emulator.raise_spot_interruption()
    emulator.inject_fault(1, status=None, delay_s=1.0)  # the token PUT hangs past the timeout
    sleeps: list[float] = []
    notice = watcher(emulator.url, sleeps=sleeps, timeout_s=0.2).poll()
    assert notice is not None and len(sleeps) == 1


def test_imds_disabled_403_is_not_retried(emulator: MetadataEmulator) -> None:
    sleeps: list[float] = []
    emulator.inject_fault(1, status=403)
    with pytest.raises(MetadataError, match="403"):
        watcher(emulator.url, sleeps=sleeps).poll()
    assert sleeps == []


def test_watch_loop_survives_errors_and_still_reports(emulator: MetadataEmulator) -> None:
    """NTH panicked on three identical IMDS errors (#668, #916); ours keeps polling."""
    emulator.inject_fault(20, status=500)
    errors: list[str] = []
    seen = threading.Event()
    stop = threading.Event()

    def on_error(name: str, err: MetadataError) -> None:
        errors.append(name)
        if len(errors) == 3:
            emulator.raise_spot_interruption()

    thread = threading.Thread(target=run_watcher, daemon=True, args=(
        watcher(emulator.url, backoff=Backoff(attempts=2, base_s=0.0)),
        lambda notice: seen.set(), stop, 0.01, on_error))
    thread.start()
    assert seen.wait(10)
    stop.set()
    thread.join(5)
    assert errors[:3] == ["aws", "aws", "aws"]


def test_ttl_outside_range_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"1\.\.21600"):
        ImdsWatcher("http://127.0.0.1:9", clock=time.time, token_ttl_s=0)


def test_instance_id(emulator: MetadataEmulator) -> None:
    assert watcher(emulator.url).instance_id() == emulator.state.instance_id
