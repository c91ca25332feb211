import pytest

from handler.serving.metrics import ENGINE_MODES, RecordingSink, observe_engine_mode


def test_engine_mode_sets_its_series_to_one_and_the_others_to_zero():
    sink = RecordingSink()
    observe_engine_mode(sink, "compiling")
    assert {label: value for _, value, label in sink.values} == {m: float(m == "compiling") for m in ENGINE_MODES}


def test_engine_mode_refuses_a_mode_it_does_not_know():
    with pytest.raises(AssertionError):
        observe_engine_mode(RecordingSink(), "warm")
