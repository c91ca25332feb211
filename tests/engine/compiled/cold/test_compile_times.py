from __future__ import annotations

import json
import logging

import pytest

from handler.engine.compiled.cold import compile_times
from handler.engine.compiled.cold.compile_times import REFERENCE, REFERENCE_LAYERS

PARTS = tuple(REFERENCE)


def test_with_no_times_of_its_own_a_machine_scales_the_reference_to_its_model(tmp_path):
    expected, basis = compile_times.expected(tmp_path, PARTS, REFERENCE_LAYERS // 2, cores=2)
    assert expected == pytest.approx({p: s / 2 for p, s in REFERENCE.items()})
    assert basis == "a 2-core reference machine"


def test_a_core_for_each_part_is_faster_than_the_reference_two(tmp_path):
    expected, _ = compile_times.expected(tmp_path, PARTS, REFERENCE_LAYERS, cores=8)
    assert expected == pytest.approx({p: s * 2 / 3 for p, s in REFERENCE.items()})


def test_a_recorded_compile_is_what_the_next_one_of_a_model_as_deep_expects(tmp_path):
    compile_times.save(tmp_path, 10, dict.fromkeys(PARTS, 40.0))
    compile_times.save(tmp_path, 30, dict.fromkeys(PARTS, 90.0))
    assert compile_times.expected(tmp_path, PARTS, 10, cores=2) == (dict.fromkeys(PARTS, 40.0), "this machine's last compile")
    assert compile_times.expected(tmp_path, PARTS, 30, cores=2)[0] == dict.fromkeys(PARTS, 90.0)
    assert compile_times.expected(tmp_path, PARTS, 20, cores=2)[1] == "a 2-core reference machine"


@pytest.mark.parametrize("text", [
    "{not json",
    "[1, 2]",
    json.dumps({"30": {**dict.fromkeys(PARTS, 9), "prefill": "slow"}}),
    json.dumps({"30": dict.fromkeys(PARTS, 0)}),
])
def test_an_unusable_record_falls_back_to_the_reference_with_a_warning(tmp_path, caplog, text):
    (tmp_path / compile_times.FILE).write_text(text)
    with caplog.at_level(logging.WARNING, logger=compile_times.__name__):
        _, basis = compile_times.expected(tmp_path, PARTS, REFERENCE_LAYERS, cores=2)
    assert basis == "a 2-core reference machine" and f"compile times at {tmp_path}" in caplog.text


def test_recording_over_an_unreadable_file_replaces_it(tmp_path):
    (tmp_path / compile_times.FILE).write_text("{not json")
    compile_times.save(tmp_path, 30, dict.fromkeys(PARTS, 90.0))
    assert compile_times.expected(tmp_path, PARTS, 30, cores=2)[0] == dict.fromkeys(PARTS, 90.0)
