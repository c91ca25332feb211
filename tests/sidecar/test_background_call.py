"""handler/sidecar/background_call.py: a call run call and joined with a bound."""
from __future__ import annotations

import threading

from handler.sidecar.background_call import BackgroundCall


def test_a_call_that_returns_gives_its_result_and_times():
    ticks = iter([10.0, 12.5])
    call = BackgroundCall(lambda: "done", "test", clock=lambda: next(ticks))
    assert call.join(5.0)
    assert (call.result, call.error, call.started, call.ended) == ("done", None, 10.0, 12.5)


def test_a_call_that_raises_hands_its_error_to_whoever_joins():
    def fail() -> None:
        raise ValueError("store said no")

    call = BackgroundCall(fail, "test")
    assert call.join(5.0)
    assert isinstance(call.error, ValueError) and call.result is None and call.ended is not None


def test_a_call_still_running_at_the_bound_is_left_running():
    release = threading.Event()
    call = BackgroundCall(lambda: release.wait(5.0), "test")
    assert not call.join(0.05)
    assert call.ended is None
    release.set()
    assert call.join(5.0) and call.result is True
