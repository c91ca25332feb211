"""Request lifecycle of both batching modes on counting steps (tests/support/tiny_model.py).

The counting steps continue a prompt through the alphabet ("a" -> "bcd..."), so every reply's
text is known; the real-engine versions of the streaming tests are in test_service.py.
"""
from __future__ import annotations

import json
import threading

import pytest

from handler.serving import step_thread
from handler.serving.continuous_service import FRESH_START_DELAY, QUIET_CALLS, ContinuousService
from handler.serving.dynamic_service import DynamicService
from handler.serving.live import Incoming, Reply
from handler.serving.request_fields import Limits
from tests.support.recording_sink import RecordingSink
from tests.support.service_driver import drive
from tests.support.tiny_model import counting_engine

LIMITS = Limits(max_seq_len=64, max_new_tokens_cap=32, default_max_new_tokens=4, served_model_name="llm")


def req(prompt: str = "a", n: int = 3, stream: bool = False, **extra) -> dict:
    return {"prompt": prompt, "max_new_tokens": n, "stream": stream, **extra}


def continuous(slots: int = 4, sink: RecordingSink | None = None, **kwargs) -> ContinuousService:
    return ContinuousService(counting_engine(slots)[0], LIMITS, sink or RecordingSink(), **kwargs)


def ndjson(replies: list[Reply]) -> list[dict]:
    return [json.loads(line) for r in replies for line in r.body.splitlines()]


# ---- continuous batching ----------------------------------------------------------------------

def test_a_whole_answer_comes_in_the_last_reply():
    replies = drive(continuous(), [Incoming("a", req("a", n=3), True)])["a"]
    body = json.loads(replies[-1].body)
    assert (body["text"], body["finish_reason"], body["usage"]["completion_tokens"]) == ("bcd", "length", 3)


def test_a_non_streaming_http_request_is_held_until_one_whole_response():
    replies = drive(continuous(), [Incoming("a", req(n=3), True)])["a"]
    assert replies[:-1] == [None, None], "no reply until its end: TorchServe sends it again each call"
    assert replies[-1].more is None and replies[-1].status == 200


def test_streamed_pieces_carry_each_new_piece_of_text():
    replies = drive(continuous(), [Incoming("a", req("a", n=3, stream=True), True)])["a"]
    assert [p["text"] for p in ndjson(replies)] == ["b", "c", "d"]
    assert [r.more for r in replies] == [True, True, False]
    assert replies[0].content_type == "application/x-ndjson"


def test_a_request_finishing_in_its_first_call_is_a_whole_response():
    [reply] = drive(continuous(), [Incoming("a", req(n=1, stream=True), True)])["a"]
    assert reply.more is None and reply.status == 200


def test_an_invalid_request_gets_a_400_and_the_others_are_served():
    replies = drive(continuous(), [Incoming("bad", {"prompt": ""}, True), Incoming("good", req("h"), True)])
    assert replies["bad"][0].status == 400 and replies["bad"][0].more is None
    assert "empty" in json.loads(replies["bad"][0].body)["error"]["message"]
    assert json.loads(replies["good"][-1].body)["text"] == "ijk"


def test_the_model_list_names_the_served_model_and_uses_no_slot():
    service = continuous(slots=1)
    service.handle([Incoming("a", req(n=5), True)])  # the only slot is taken
    [reply] = service.handle([Incoming("a", None, True), Incoming("m", b"", True, "/v1/models")])[1:]
    body = json.loads(reply.body)
    assert reply.status == 200 and reply.more is None
    assert body["object"] == "list" and [(m["id"], m["object"]) for m in body["data"]] == [("llm", "model")]


def test_a_model_is_retrieved_by_its_id_and_another_id_is_a_404():
    service = continuous()
    found, missing = service.handle([Incoming("m", b"", True, "v1/models/llm"), Incoming("x", b"", True, "v1/models/gpt-4o")])
    assert found.status == 200 and json.loads(found.body)["id"] == "llm"
    assert missing.status == 404 and "model 'gpt-4o' does not exist" in json.loads(missing.body)["error"]["message"]


def test_an_http_request_beyond_the_free_slots_waits_for_one():
    service = continuous(slots=1)
    replies = drive(service, [Incoming("a", req(n=5), True), Incoming("b", req(n=5), True)])
    assert replies["b"][0] is None, "held while it waits"
    assert json.loads(replies["b"][-1].body)["text"] == json.loads(replies["a"][-1].body)["text"] == "bcdef"


def test_a_grpc_request_beyond_the_free_slots_waits_for_one_too():
    replies = drive(continuous(slots=1), [Incoming("a", req(n=5), True), Incoming("b", req(n=5), False)])
    assert replies["b"][:5] == [None] * 5 and replies["b"][-1].more is False
    assert json.loads(replies["b"][-1].body)["text"] == "bcdef"


def test_a_grpc_request_is_held_and_answered_whole_at_its_end():
    replies = drive(continuous(), [Incoming("g", req("a", n=5), False)])["g"]
    assert replies[:-1] == [None] * 4, "TorchServe ends a gRPC call at its first reply"
    assert replies[-1].more is False and json.loads(replies[-1].body)["text"] == "bcdef"


def test_a_grpc_request_does_not_hold_up_a_concurrent_http_stream():
    service = continuous()
    first = service.handle([Incoming("http", req("a", n=8, stream=True), True)])
    rest = drive(service, [Incoming("http", None, True), Incoming("grpc", req("k", n=4), False)])
    assert all(r.more for r in rest["http"][:4]), "a piece a call while the gRPC call is held"
    assert "".join(p["text"] for p in ndjson([*first, *rest["http"]])) == "bcdefghi"
    assert json.loads(rest["grpc"][-1].body)["text"] == "lmno"


def timed(call_seconds: float, step_seconds: float = 0.010, sink: RecordingSink | None = None) -> ContinuousService:
    """A service whose clock moves only when the engine steps, by step_seconds a step."""
    now = [0.0]
    engine = counting_engine()[0]
    step = engine.step

    def timed_step():
        now[0] += step_seconds
        return step()

    engine.step = timed_step
    return ContinuousService(engine, LIMITS, sink or RecordingSink(), clock=lambda: now[0], call_seconds=call_seconds)


def pieces_per_reply(replies: list[Reply]) -> list[int]:
    return [len(r.body.splitlines()) for r in replies]


def test_a_call_goes_on_decoding_while_the_next_step_fits_its_time():
    # 10 ms steps, 35 ms a call: a third step ends at 30 ms and fits, a fourth would not.
    replies = drive(timed(0.035), [Incoming("a", req("a", n=8, stream=True), True)])["a"]
    assert pieces_per_reply(replies) == [1, 3, 3, 1]
    assert "".join(p["text"] for p in ndjson(replies)) == "bcdefghi"


def test_a_call_with_no_time_of_its_own_is_one_step():
    replies = drive(timed(0.0), [Incoming("a", req("a", n=4, stream=True), True)])["a"]
    assert pieces_per_reply(replies) == [1, 1, 1, 1]


def test_a_first_token_ends_the_call_at_once():
    service = timed(10.0)
    service.handle([Incoming("a", req("a", n=20, stream=True), True)])
    a, b = service.handle([Incoming("a", None, True), Incoming("b", req("k", n=20, stream=True), True)])
    assert [p["text"] for p in ndjson([a])] == ["c"] and [p["text"] for p in ndjson([b])] == ["l"]


def test_a_first_token_without_text_does_not_count_as_the_first_visible_one():
    # after "z" (EOS is never sampled under ignore_eos) "a" could begin the stop string "ax":
    # held back, no text; it shows with "b".
    replies = drive(timed(10.0), [Incoming("a", req("z", n=8, stream=True, stop=["ax"], ignore_eos=True), True)])["a"]
    assert [p["text"] for p in ndjson(replies[:2])] == ["ab"] and replies[0].body == ""
    assert "".join(p["text"] for p in ndjson(replies[2:])) == "cdefgh"


def test_a_finish_ends_the_call_at_once_and_the_others_go_on_next_call():
    service = timed(10.0)
    service.handle([Incoming("short", req("a", n=3, stream=True), True), Incoming("long", req("k", n=9, stream=True), True)])
    short, long = service.handle([Incoming("short", None, True), Incoming("long", None, True)])
    assert short.more is False and [p["text"] for p in ndjson([short])] == ["c", "d"]
    [rest] = service.handle([Incoming("long", None, True)])
    assert "".join(p["text"] for p in ndjson([long, rest])) == "mnopqrst" and rest.more is False


def test_a_request_the_frontend_stops_sending_is_cancelled():
    sink = RecordingSink()
    service = continuous(sink=sink)
    service.handle([Incoming("gone", req(n=20, stream=True), True)])
    service.handle([Incoming("new", req(n=2), True)])
    assert "gone" not in service.stages.live and service.stages.engine.running == 1
    assert ("ts_llm_request_failure_total", 1, "cancelled") in sink.values


def test_draining_refuses_a_new_request_with_a_503():
    sink = RecordingSink()
    [reply] = continuous(sink=sink, draining=lambda: True).handle([Incoming("new", req(), True)])
    assert reply.status == 503 and "draining" in json.loads(reply.body)["error"]["message"]
    assert ("ts_llm_request_failure_total", 1, "draining") in sink.values


def test_draining_finishes_the_running_requests():
    draining = False
    service = continuous(draining=lambda: draining)
    service.handle([Incoming("old", req(n=4, stream=True), True)])
    draining = True
    rest = drive(service, [Incoming("old", None, True)])["old"]
    assert ndjson(rest)[-1]["finish_reason"] == "length"


def test_metrics_count_the_tokens_of_a_request():
    sink = RecordingSink()
    drive(continuous(sink=sink), [Incoming("a", req("abc", n=4), True)])
    assert sink.of("ts_llm_prompt_tokens_total") == [3]
    assert sum(sink.of("ts_llm_generation_tokens_total")) == 4
    assert ("ts_llm_request_success_total", 1, "length") in sink.values


def test_latency_metrics_are_measured_on_the_injected_clock():
    sink = RecordingSink()
    drive(timed(0.0, step_seconds=1.0, sink=sink), [Incoming("a", req(n=3), True)])
    # arrival at 0, then a second a step: 1 (first token), 2, 3 (last token)
    assert sink.of("ts_llm_time_to_first_token_seconds") == [1.0]
    assert sink.of("ts_llm_e2e_request_latency_seconds") == [3.0]
    assert sink.of("ts_llm_time_per_output_token_seconds") == [1.0]


def test_an_openai_chat_request_is_answered_in_the_chat_format():
    body = {"model": "llm", "messages": [{"role": "user", "content": "p"}], "max_tokens": 2, "temperature": 0}
    replies = drive(continuous(), [Incoming("c", body, True, "v1/chat/completions")])["c"]
    answer = json.loads(replies[-1].body)
    assert answer["object"] == "chat.completion" and answer["choices"][0]["message"]["content"] == "qr"


# ---- dynamic batching -------------------------------------------------------------------------

def dynamic(slots: int = 4) -> DynamicService:
    return DynamicService(counting_engine(slots)[0], LIMITS, RecordingSink())


def test_dynamic_mode_streams_partial_replies_to_streaming_requests_only():
    sent: list[dict[int, Reply]] = []
    dynamic().handle([Incoming("s", req("a", n=3, stream=True), True), Incoming("w", req("h", n=3), True)], sent.append)
    assert [set(p) for p in sent] == [{0}, {0}]
    assert [p[0].body for p in sent] == [json.dumps({"text": t, "finish_reason": None}) + "\n" for t in "bc"]


def test_dynamic_mode_returns_each_final_reply():
    finals = dynamic().handle([Incoming("s", req("a", n=3, stream=True), True), Incoming("w", req("h", n=3), True)],
                              lambda partial: None)
    assert ndjson([finals[0]])[-1] == {"text": "d", "finish_reason": "length",
                                       "usage": {"prompt_tokens": 1, "completion_tokens": 3, "total_tokens": 4,
                                                 "prompt_tokens_details": {"cached_tokens": 0}}}
    assert finals[0].more is False, "a stream opened by partial replies is ended"
    assert json.loads(finals[1].body)["text"] == "ijk" and finals[1].more is None


def test_dynamic_mode_serves_a_batch_larger_than_the_slots():
    batch = [Incoming(str(i), req(p, n=2), True) for i, p in enumerate("ahp")]
    finals = dynamic(slots=2).handle(batch, lambda partial: None)
    assert [json.loads(r.body)["text"] for r in finals] == ["bc", "ij", "qr"]


def test_dynamic_mode_answers_an_invalid_request_with_its_400():
    finals = dynamic().handle([Incoming("bad", {"x": 1}, True), Incoming("ok", req(), True)], lambda partial: None)
    assert finals[0].status == 400 and finals[1].status == 200


def test_a_schema_request_to_an_engine_without_grammars_is_a_400():
    replies = drive(continuous(), [Incoming("a", req(response_format={"type": "json_object"}), True)])
    assert replies["a"][0].status == 400
    assert "`response_format` is not supported by this engine" in json.loads(replies["a"][0].body)["error"]["message"]


def test_a_matcher_that_cannot_start_is_a_400_and_takes_no_slot():
    from handler.engine.grammar import GrammarError

    class UnstartableGrammars:  # compiles every schema, starts no matcher (a grammar over its limits)
        def grammar(self, schema: str) -> str:
            return schema

        def matcher(self, schema: str):
            raise GrammarError("invalid JSON schema: too complex")

    service = continuous()
    service.stages.engine.grammars = UnstartableGrammars()
    replies = drive(service, [Incoming("a", req(response_format={"type": "json_object"}), True)])
    assert replies["a"][0].status == 400
    assert json.loads(replies["a"][0].body)["error"]["message"] == "`response_format`: invalid JSON schema: too complex"
    assert service.stages.engine.free_slots == 4 and not service.stages.live


# ---- continuous batching, stepping ahead ---------------------------------------------------------

def ahead(slots: int = 4, sink: RecordingSink | None = None) -> ContinuousService:
    return continuous(slots, sink, step_ahead=True)


def test_stepping_ahead_answers_each_call_with_the_step_run_since_the_last():
    service = ahead()
    steps = []
    step = service.stages.engine.step
    service.stages.engine.step = lambda: steps.append(1) or step()
    replies = drive(service, [Incoming("a", req("a", n=4, stream=True), True)])["a"]
    assert pieces_per_reply(replies) == [1, 1, 1, 1]
    assert "".join(p["text"] for p in ndjson(replies)) == "bcde"
    assert len(steps) == 4  # no step but the one each call answers with


def test_every_step_runs_on_the_step_thread():
    service = ahead()
    threads = set()
    step = service.stages.engine.step
    service.stages.engine.step = lambda: threads.add(threading.current_thread().name) or step()
    drive(service, [Incoming("a", req("a", n=3, stream=True), True), Incoming("g", req("k", n=2), False)])
    assert len(threads) == 1 and threading.current_thread().name not in threads


def test_a_request_gone_while_its_step_ran_ahead_is_cancelled_and_frees_its_slot():
    sink = RecordingSink()
    service = ahead(slots=1, sink=sink)
    service.handle([Incoming("gone", req(n=20, stream=True), True)])  # its next step runs ahead
    [reply] = service.handle([Incoming("new", req("k", n=2, stream=True), True)])
    assert "gone" not in service.stages.live and ("ts_llm_request_failure_total", 1, "cancelled") in sink.values
    rest = drive(service, [Incoming("new", None, True)])["new"]
    assert "".join(p["text"] for p in ndjson([reply, *rest])) == "lm"


def test_a_request_arriving_while_a_step_ran_ahead_gets_its_first_token_in_that_call():
    service = quiet_ahead()
    ahead = chr(ord("b") + QUIET_CALLS + 1)  # a's letter in the step run ahead ("b" came with a's arrival)
    a, b = service.handle([Incoming("a", None, True), Incoming("b", req("k", n=3, stream=True), True)])
    assert [p["text"] for p in ndjson([b])] == ["l"], "b's first token comes in the call that admits it"
    assert [p["text"] for p in ndjson([a])] == [ahead, chr(ord(ahead) + 1)], "a: the step run ahead, then b's"
    assert service._step_thread._ahead is None, "the next call's requests are in the next step"


def test_steps_run_ahead_again_after_calls_that_admit_and_finish_nothing():
    service = quiet_ahead()
    service.handle([Incoming("a", None, True), Incoming("b", req("k", n=2, stream=True), True)])
    service.handle([Incoming("a", None, True), Incoming("b", None, True)])
    service.handle([Incoming("a", None, True), Incoming("b", None, True)])  # b's finish
    steps = []
    step = service.stages.engine.step
    service.stages.engine.step = lambda: steps.append(1) or step()
    for _ in range(QUIET_CALLS - 1):
        service.handle([Incoming("a", None, True)])
        assert service._step_thread._ahead is None
    service.handle([Incoming("a", None, True)])
    service._step_thread._ahead.result()
    assert len(steps) == QUIET_CALLS + 1, "a step each call, then one run ahead"


def test_an_arrival_into_an_idle_engine_starts_the_next_step_ahead_after_a_pause(monkeypatch):
    pauses = []
    monkeypatch.setattr(step_thread, "sleep", pauses.append)  # this module's pause only
    service = ahead()
    [reply] = service.handle([Incoming("a", req("a", n=4, stream=True), True)])
    assert [p["text"] for p in ndjson([reply])] == ["b"]
    service._step_thread._ahead.result()
    assert pauses == [FRESH_START_DELAY]
    [reply] = service.handle([Incoming("a", None, True)])
    assert [p["text"] for p in ndjson([reply])] == ["c"], "answered with the step run ahead"


def test_an_arrival_beside_a_running_request_starts_no_step_ahead():
    service = ahead()
    service.handle([Incoming("a", req("a", n=20, stream=True), True)])
    service.handle([Incoming("a", None, True), Incoming("b", req("k", n=3, stream=True), True)])
    assert service._step_thread._ahead is None, "the next call may bring more requests: its own step holds them"


def quiet_ahead() -> ContinuousService:
    """A stepping-ahead service streaming request a, QUIET_CALLS into it: a step runs ahead."""
    service = ahead()
    service.handle([Incoming("a", req("a", n=20, stream=True), True)])
    for _ in range(QUIET_CALLS):
        service.handle([Incoming("a", None, True)])
    assert service._step_thread._ahead is not None
    return service


def test_a_step_that_failed_ahead_fails_the_next_call():
    service = ahead()
    calls, step = [], service.stages.engine.step
    service.stages.engine.step = lambda: step() if calls.append(1) or len(calls) < 2 else 1 / 0  # the second step fails
    service.handle([Incoming("a", req("a", n=8, stream=True), True)])  # runs step 1, starts step 2 ahead
    with pytest.raises(ZeroDivisionError):
        service.handle([Incoming("a", None, True)])
