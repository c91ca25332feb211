"""How many prompt tokens a step may prefill (handler.engine.prefill_pace), on a fake clock."""
from __future__ import annotations

from handler.engine.prefill_pace import PrefillPace


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def timed(pace: PrefillPace, clock: Clock, tokens: int, seconds: float) -> None:
    with pace.timing(tokens):
        clock.now += seconds


def test_the_whole_chunk_while_nothing_decodes_or_before_a_measurement():
    clock = Clock()
    pace = PrefillPace(512, 0.2, clock)
    assert pace.budget(decoding=True) == 512, "no speed measured yet"
    timed(pace, clock, 100, 1.0)
    assert pace.budget(decoding=False) == 512


def test_while_sequences_decode_what_fits_the_stall_at_the_measured_speed():
    clock = Clock()
    pace = PrefillPace(512, 0.2, clock)
    timed(pace, clock, 100, 1.0)  # 10 ms a token: 20 fit in 0.2 s
    assert pace.budget(decoding=True) == 20
    timed(pace, clock, 20, 0.1)  # 5 ms a token: averaged with the last, 7.5 ms
    assert pace.budget(decoding=True) == 24, "26 fit, cut to a multiple of the padding"


def test_at_least_one_padded_chunk_and_at_most_the_chunk():
    clock = Clock()
    slow, fast = PrefillPace(512, 0.2, clock), PrefillPace(512, 0.2, clock)
    timed(slow, clock, 1, 10.0)
    timed(fast, clock, 1000, 0.001)
    assert (slow.budget(decoding=True), fast.budget(decoding=True)) == (4, 512)


def test_no_stall_bound_always_the_chunk():
    clock = Clock()
    pace = PrefillPace(512, None, clock)
    timed(pace, clock, 100, 1.0)
    assert pace.budget(decoding=True) == 512
