"""bench.chaos's long streams: each joined answer against its own request's uncut reference, per kind."""
from __future__ import annotations

from bench.chaos.report import security_summary
from bench.chaos.resume import LongStream, grpc_reply, kinds, summary


def stream(kind: str, prompt: str, *texts: str, cut: bool = False, finished: bool = True) -> LongStream:
    return LongStream(kind, prompt, dict(enumerate(texts)), cut=cut, resumed=cut and finished, finished=finished)


def test_each_stream_is_compared_with_its_own_prompts_reference():
    (_, a), (_, b) = kinds({"native": 2})
    expected = {a: stream("native", a, "one two three").answer, b: stream("native", b, "four five six").answer}
    streams = [stream("native", a, "one two three", cut=True), stream("native", b, "four five SIX", cut=True),
               stream("native", a, "one two three")]
    result = summary(streams, expected)
    assert result["fresh_replica_token_mismatch"] == 1 and result["cut_token_mismatch"] == 1
    assert result["first_difference_at_chars"] == [10]
    assert result["cut"] == 2 and result["resumed"] == 2 and result["finished_uncut"] == 1


def test_every_choice_and_tool_call_is_part_of_the_answer():
    [(_, a)] = kinds({"n2": 1})
    expected = {a: stream("n2", a, "left", "right").answer}
    result = summary([stream("n2", a, "left", "wrong", cut=True)], expected)
    assert result["kinds"]["n2"]["fresh_replica_token_mismatch"] == 1
    called = stream("tools", a, "")
    called.calls.append(("get_weather", '{"city": "Oslo"}'))
    assert called.answer != stream("tools", a, "").answer


def test_a_stream_that_did_not_finish_is_a_failure_of_its_kind_not_a_mismatch():
    [(_, a), (_, b)] = kinds({"native": 1, "non_streaming": 1})
    streams = [stream("native", a, "one", cut=True), stream("non_streaming", b, "", finished=False)]
    result = summary(streams, {a: stream("native", a, "one").answer, b: "x"})
    assert result["failures"] == 1 and result["fresh_replica_token_mismatch"] == 0
    assert result["kinds"]["non_streaming"]["failures"] == 1 and result["kinds"]["native"]["failures"] == 0


def test_the_long_streams_prompts_differ():
    prompts = [p for _, p in kinds({"native": 40, "n2": 20, "tools": 20})]
    assert len(set(prompts)) == 80


def test_an_unchecked_edit_is_reported_as_unchecked_not_refused():
    unchecked = security_summary({"edited_record": {"checked": False}, "public_id": {"in_public_id": False}})
    refused = security_summary({"edited_record": {"checked": True, "accepted": 0, "status": 404},
                                "public_id": {"in_public_id": False}})
    assert unchecked["edited_record_accepted"] is None and refused["edited_record_accepted"] == 0
    assert refused["resume_token_in_public_id"] is False


def test_a_grpc_reply_is_read_as_lines_and_a_refusal_without_a_resume_id_is_none():
    whole, resumed, refused = LongStream("grpc", "p"), LongStream("grpc", "p"), LongStream("grpc", "p")
    assert grpc_reply(b'{"text": "one two", "finish_reason": "length"}', whole)["finish_reason"] == "length"
    cut = grpc_reply(b'{"error": {"code": 503, "resume": "k.0"}, "resume": "k.0"}', resumed)
    assert cut["error"]["resume"] == "k.0" and whole.texts == {0: "one two"}
    assert grpc_reply(b'{"text": "one"}\n{"text": " two", "finish_reason": "length"}', resumed)["finish_reason"] == "length"
    assert resumed.texts == {0: "one two"}
    assert grpc_reply(b'{"error": {"code": 503, "message": "draining"}}', refused) is None
