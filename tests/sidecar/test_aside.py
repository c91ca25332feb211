"""handler/sidecar/aside.py: a call run aside and joined with a bound."""
from __future__ import annotations

import threading

from handler.sidecar.aside import Aside


def test_a_call_that_returns_gives_its_result_and_times():
    ticks = iter([10.0, 12.5])
    aside = Aside(lambda: "done", "test", clock=lambda: next(ticks))
    assert aside.join(5.0)
    assert (aside.result, aside.error, aside.started, aside.ended) == ("done", None, 10.0, 12.5)


def test_a_call_that_raises_hands_its_error_to_whoever_joins():
    def fail() -> None:
        raise ValueError("store said no")

    aside = Aside(fail, "test")
    assert aside.join(5.0)
    assert isinstance(aside.error, ValueError) and aside.result is None and aside.ended is not None


def test_a_call_still_running_at_the_bound_is_left_running():
    release = threading.Event()
    aside = Aside(lambda: release.wait(5.0), "test")
    assert not aside.join(0.05)
    assert aside.ended is None
    release.set()
    assert aside.join(5.0) and aside.result is True
