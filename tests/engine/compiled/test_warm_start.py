"""BackgroundLoad: eager steps until the load finishes, then the loaded ones; failures are loud."""
from __future__ import annotations

import logging
import threading
from types import SimpleNamespace

import pytest

from handler.engine.compiled.errors import CompileError
from handler.engine.compiled.warm_start import LOADED, BackgroundLoad

EAGER = SimpleNamespace(prefill=lambda x: ("eager prefill", x), decode=lambda x: ("eager decode", x))
COMPILED = SimpleNamespace(prefill=lambda x: ("compiled prefill", x), decode=lambda x: ("compiled decode", x))


def _gated(result=COMPILED, error: Exception | None = None):
    """A load that finishes only when the test opens the gate."""
    gate = threading.Event()

    def load():
        assert gate.wait(10)
        if error is not None:
            raise error
        return result

    return gate, load


def test_eager_steps_serve_until_the_load_finishes_then_the_loaded_ones(caplog):
    caplog.set_level(logging.INFO, logger="handler.engine.compiled.warm_start")
    gate, load = _gated()
    compiled = []
    bg = BackgroundLoad(EAGER, load, allow_eager=False, on_compiled=compiled.append).start()
    prefill, decode = bg.step("prefill"), bg.step("decode")
    assert prefill(1) == ("eager prefill", 1) and decode(2) == ("eager decode", 2)
    assert not bg.compiled and LOADED not in caplog.text
    gate.set()
    assert bg.done.wait(10) and bg.compiled
    assert LOADED in caplog.text, "the load says so when it ends: benchmarks drive a step then"
    assert decode(3) == ("compiled decode", 3) and prefill(4) == ("compiled prefill", 4)
    assert len(compiled) == 1 and compiled[0] >= 0, "reported once"


def test_the_switch_is_reported_as_the_load_ends_with_no_step_run():
    # An idle replica runs no step: its engine-mode gauge must not wait for the next request.
    gate, load = _gated()
    compiled: list[float] = []
    bg = BackgroundLoad(EAGER, load, allow_eager=False, on_compiled=compiled.append).start()
    assert compiled == []
    gate.set()
    assert bg.done.wait(10)
    assert len(compiled) == 1, "reported before done is set, with no step run"


def test_a_failed_load_is_reported_as_it_ends_with_no_step_run():
    gate, load = _gated(error=RuntimeError("bad graph"))
    failures: list[str] = []
    bg = BackgroundLoad(EAGER, load, allow_eager=True, on_failed=failures.append).start()
    gate.set()
    assert bg.done.wait(10)
    assert failures == ["RuntimeError: bad graph"]


def test_a_failed_load_raises_at_every_step_unless_eager_is_allowed():
    gate, load = _gated(error=RuntimeError("bad graph\nmore detail"))
    bg = BackgroundLoad(EAGER, load, allow_eager=False).start()
    gate.set()
    assert bg.done.wait(10) and not bg.compiled
    for _ in range(2):
        with pytest.raises(CompileError, match=r"in the background failed \(RuntimeError: bad graph\)"):
            bg.step("decode")(1)


def test_a_failed_load_serves_eager_and_is_reported_once_when_allowed(caplog):
    caplog.set_level(logging.INFO, logger="handler.engine.compiled.warm_start")
    gate, load = _gated(error=RuntimeError("bad graph"))
    failures = []
    bg = BackgroundLoad(EAGER, load, allow_eager=True, on_failed=failures.append).start()
    gate.set()
    assert bg.done.wait(10)
    assert bg.step("decode")(1) == ("eager decode", 1) and bg.step("prefill")(2) == ("eager prefill", 2)
    assert failures == ["RuntimeError: bad graph"] and LOADED not in caplog.text
    assert [r.levelname for r in caplog.records if "FAILED" in r.message] == ["ERROR"]
