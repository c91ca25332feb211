import logging
from pathlib import Path

import pytest

from handler.serving.metrics import COUNTER_WRITE_S, ENGINE_MODES, EngineModeGauge, TorchServeSink, observe_engine_mode
from tests.support.recording_sink import RecordingSink


def test_engine_mode_sets_its_series_to_one_and_the_others_to_zero():
    sink = RecordingSink()
    observe_engine_mode(sink, "compiling")
    assert {label: value for _, value, label in sink.values} == {m: float(m == "compiling") for m in ENGINE_MODES}


def test_engine_mode_refuses_a_mode_it_does_not_know():
    with pytest.raises(AssertionError):
        observe_engine_mode(RecordingSink(), "warm")


def _mode(sink: RecordingSink) -> str:
    """The mode whose series was last set to 1."""
    return [label for name, value, label in sink.values if name == "ts_llm_engine_mode" and value == 1][-1]


def test_engine_mode_gauge_reports_the_start_then_what_the_load_settled_on():
    sink = RecordingSink()
    gauge = EngineModeGauge(sink)
    gauge.started("loading")
    assert _mode(sink) == "loading"
    gauge.settled("compiled")
    assert _mode(sink) == "compiled"


def test_a_load_that_settles_before_the_start_is_reported_is_not_overwritten():
    sink = RecordingSink()
    gauge = EngineModeGauge(sink)
    gauge.settled("compiled")  # the background load won the race with the handler's start
    gauge.started("loading")
    assert _mode(sink) == "compiled"


class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _torchserve_sink(clock):
    from ts.metrics.metric_cache_yaml_impl import MetricsCacheYamlImpl

    cache = MetricsCacheYamlImpl(str(Path(__file__).parents[2] / "metrics.yaml"))
    cache.initialize_cache()
    return TorchServeSink(cache, "llm", clock)


def _written(caplog) -> list[tuple[str, str]]:
    """(metric name, value) of each [METRICS] line TorchServe's cache logged."""
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("[METRICS]")]
    return [(line[len("[METRICS]"):].split(".")[0], line.split(":")[1].split("|")[0]) for line in lines]


def test_torchserve_sink_writes_a_gauge_only_when_it_changes(caplog):
    caplog.set_level(logging.INFO)
    sink = _torchserve_sink(_Clock())
    for running in (1, 1, 1, 2, 2, 0):
        sink.observe("ts_llm_requests_running", running)
    assert _written(caplog) == [("ts_llm_requests_running", v) for v in ("1", "2", "0")]


def test_torchserve_sink_sums_step_counters_until_a_second_passed_or_flush(caplog):
    caplog.set_level(logging.INFO)
    clock = _Clock()
    sink = _torchserve_sink(clock)
    for _ in range(3):
        sink.observe("ts_llm_generation_tokens_total", 2)
    assert _written(caplog) == []
    clock.now = COUNTER_WRITE_S
    sink.observe("ts_llm_generation_tokens_total", 2)
    sink.observe("ts_llm_generation_tokens_total", 5)
    sink.flush()
    sink.flush()  # nothing left: writes nothing
    assert _written(caplog) == [("ts_llm_generation_tokens_total", "8"), ("ts_llm_generation_tokens_total", "5")]


def test_torchserve_sink_writes_histograms_and_request_counters_at_once(caplog):
    caplog.set_level(logging.INFO)
    sink = _torchserve_sink(_Clock())
    sink.observe("ts_llm_time_to_first_token_seconds", 0.25)
    sink.observe("ts_llm_time_to_first_token_seconds", 0.25)
    sink.observe("ts_llm_request_failure_total", 1, "invalid_request")
    assert [name for name, _ in _written(caplog)] == ["ts_llm_time_to_first_token_seconds"] * 2 + ["ts_llm_request_failure_total"]
