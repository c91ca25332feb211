"""The event id scheme: `<key>.<point>`, a point per sample; the key's first 8 hex digits the stream's start time."""
from __future__ import annotations

import pytest

from handler.resume.ids import ResumeIdError, ResumePoint, event_id, key_time, new_key, parse_event_id


def test_a_key_carries_its_start_time_and_96_random_bits():
    keys = {new_key(now=1_700_000_000.7) for _ in range(100)}
    assert len(keys) == 100 and all(len(k) == 32 and key_time(k) == 1_700_000_000 for k in keys)


def test_an_event_id_round_trips():
    key = new_key()
    assert parse_event_id(event_id(key, (42,))) == ResumePoint(key, (42,))
    assert str(ResumePoint(key, (0,))) == f"{key}.0"


def test_an_event_id_of_several_samples_has_a_point_each():
    key = new_key()
    assert event_id(key, (3, 0, 17)) == f"{key}.3.0.17"
    assert parse_event_id(f"{key}.3.0.17") == ResumePoint(key, (3, 0, 17))


@pytest.mark.parametrize("text", ["", "abc.1", "0" * 32, "0" * 32 + ".", "0" * 32 + ".-1", "0" * 32 + ".01",
                                  "G" * 32 + ".1", "0" * 31 + ".1", "0" * 32 + ".1.", "0" * 32 + ".1..2", "0" * 32 + ".1234567890",
                                  "0" * 32 + ".1" * 17])
def test_anything_else_is_refused(text):
    with pytest.raises(ResumeIdError, match="not an event id"):
        parse_event_id(text)
