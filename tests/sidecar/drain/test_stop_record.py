"""The stop reserve from measured stops: recorded per drain, read by the next one."""

from __future__ import annotations

import dataclasses

import pytest

from handler.sidecar.drain.stop_record import (
    FLOOR_S,
    MAX_S,
    RECORDED,
    encode_stop_seconds,
    parse_stop_seconds,
    read_stop_seconds,
    record_stop_seconds,
    stop_reserve,
)


def test_no_measurement_keeps_the_configured_reserve() -> None:
    assert stop_reserve([], default_s=10.0) == 10.0


def test_the_reserve_is_the_slowest_stop_plus_a_quarter_or_a_second() -> None:
    assert stop_reserve([2.6, 2.9], default_s=10.0) == pytest.approx(3.9)
    assert stop_reserve([8.0], default_s=10.0) == pytest.approx(10.0)
    assert stop_reserve([14.0], default_s=10.0) == pytest.approx(17.5)  # slower than the default


def test_stops_that_found_torchserve_gone_do_not_shrink_the_reserve_below_the_floor() -> None:
    assert stop_reserve([0.1], default_s=10.0) == FLOOR_S


def test_the_last_stops_are_kept(tmp_path) -> None:
    path = tmp_path / "state" / "stop-seconds.json"
    for seconds in range(1, RECORDED + 3):
        record_stop_seconds(path, float(seconds))
    assert read_stop_seconds(path) == [float(s) for s in range(3, RECORDED + 3)]


def test_an_unreadable_record_is_ignored_with_a_warning(tmp_path, caplog) -> None:
    path = tmp_path / "stop-seconds.json"
    path.write_text("{not json")
    assert read_stop_seconds(path) == [] and "unreadable" in caplog.text


@pytest.mark.parametrize("measured_stop_s", [2.45, 2.93, 4.0])
def test_with_the_defaults_a_30_s_grace_lets_streams_of_grace_minus_stop_minus_3_s_finish(measured_stop_s) -> None:
    from handler.sidecar.config import SidecarConfig
    from handler.sidecar.drain.plan import plan_drain

    policy = SidecarConfig().drain_policy()
    policy = dataclasses.replace(policy, stop_reserve_s=stop_reserve([measured_stop_s], policy.stop_reserve_s))
    plan = plan_drain(30.0, 0.0, policy)  # SIGTERM with a 30 s grace, nothing to publish
    # The handler cuts what still runs cut_lead_s before the wait ends.
    assert plan.wait_until - policy.cut_lead_s >= 30.0 - measured_stop_s - 3.0 - 1e-9


@pytest.mark.parametrize("data", [
    b'{"stop_seconds": [2.5, -1]}', b'{"stop_seconds": [2.5, 300]}', b'{"stop_seconds": [true]}',
    b'{"stop_seconds": ["2.5"]}', b'{"stop_seconds": [NaN]}', b'{"stop_seconds": [Infinity]}',
    b'{"stop_seconds": 2.5}', b'[2.5]', b'{}', b'not json',
])
def test_a_record_that_is_not_numbers_in_range_is_refused_whole(data: bytes) -> None:
    """The record may come from the fleet's store: data to check, never trusted."""
    with pytest.raises(ValueError):
        parse_stop_seconds(data)


def test_a_valid_record_keeps_its_last_values() -> None:
    values = [float(v) for v in range(1, RECORDED + 3)]
    assert parse_stop_seconds(encode_stop_seconds(values)) == values[-RECORDED:]
    assert parse_stop_seconds(b'{"stop_seconds": [2, 2.5]}') == [2.0, 2.5]


def test_a_stop_that_measured_nothing_is_not_recorded(tmp_path) -> None:
    path = tmp_path / "stop-seconds.json"
    record_stop_seconds(path, 0.0)
    assert not path.exists()
    record_stop_seconds(path, 2.5)
    record_stop_seconds(path, MAX_S + 1)
    assert read_stop_seconds(path) == [2.5]
