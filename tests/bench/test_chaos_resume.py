"""bench.chaos's long streams: each joined answer against its own request's uncut reference."""
from __future__ import annotations

from bench.chaos.report import security_summary
from bench.chaos.resume import LongStream, prompts, summary


def stream(prompt: str, text: str, cut: bool = False, finished: bool = True) -> LongStream:
    return LongStream(prompt, text, cut=cut, resumed=cut and finished, finished=finished)


def test_each_stream_is_compared_with_its_own_prompts_reference():
    a, b = prompts(2)
    expected = {a: "one two three", b: "four five six"}
    streams = [stream(a, "one two three", cut=True), stream(b, "four five SIX", cut=True), stream(a, "one two three")]
    result = summary(streams, expected)
    assert result["fresh_replica_token_mismatch"] == 1 and result["cut_token_mismatch"] == 1
    assert result["first_difference_at_chars"] == [10]
    assert result["cut"] == 2 and result["resumed"] == 2 and result["finished_uncut"] == 1


def test_a_stream_that_did_not_finish_is_a_failure_not_a_mismatch():
    [a] = prompts(1)
    result = summary([stream(a, "one", cut=True, finished=False)], {a: "one two"})
    assert result["failed"] == 1 and result["fresh_replica_token_mismatch"] == 0


def test_the_long_streams_prompts_differ():
    assert len(set(prompts(80))) == 80


def test_an_unchecked_edit_is_reported_as_unchecked_not_refused():
    unchecked = security_summary({"edited_record": {"checked": False}, "public_id": {"in_public_id": False}})
    refused = security_summary({"edited_record": {"checked": True, "accepted": 0, "status": 404},
                                "public_id": {"in_public_id": False}})
    assert unchecked["edited_record_accepted"] is None and refused["edited_record_accepted"] == 0
    assert refused["resume_token_in_public_id"] is False
