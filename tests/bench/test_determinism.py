"""bench/determinism.py's comparison: the first generated position where two answers part."""
from __future__ import annotations

from bench.determinism import first_difference


def test_the_first_position_that_differs():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2, 3], [1, 2]) == 2, "one answer stopped sooner"
