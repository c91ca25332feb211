"""The stop reserve from measured stops: recorded per drain, read by the next one."""

from __future__ import annotations

import pytest

from handler.sidecar.drain.stop_record import RECORDED, read_stop_seconds, record_stop_seconds, stop_reserve


def test_no_measurement_keeps_the_configured_reserve() -> None:
    assert stop_reserve([], default_s=10.0, min_stop_s=5.0) == 10.0


def test_the_reserve_is_the_slowest_stop_plus_a_quarter_or_a_second() -> None:
    assert stop_reserve([2.6, 2.9], default_s=10.0, min_stop_s=2.0) == pytest.approx(3.9)
    assert stop_reserve([8.0], default_s=10.0, min_stop_s=2.0) == pytest.approx(10.0)
    assert stop_reserve([14.0], default_s=10.0, min_stop_s=2.0) == pytest.approx(17.5)  # slower than the default


def test_the_reserve_is_never_below_the_minimum_stop() -> None:
    assert stop_reserve([0.4], default_s=10.0, min_stop_s=5.0) == 5.0


def test_the_last_stops_are_kept(tmp_path) -> None:
    path = tmp_path / "state" / "stop-seconds.json"
    for seconds in range(1, RECORDED + 3):
        record_stop_seconds(path, float(seconds))
    assert read_stop_seconds(path) == [float(s) for s in range(3, RECORDED + 3)]


def test_an_unreadable_record_is_ignored_with_a_warning(tmp_path, caplog) -> None:
    path = tmp_path / "stop-seconds.json"
    path.write_text("{not json")
    assert read_stop_seconds(path) == [] and "unreadable" in caplog.text
