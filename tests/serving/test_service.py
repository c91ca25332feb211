"""The request lifecycle of both batching modes, driven as TorchServe drives it, on the real engine."""
from __future__ import annotations

import itertools
import json

import pytest

from handler.engine.config import EngineConfig
from handler.engine.factory import build_engine
from handler.serving.continuous_service import ContinuousService
from handler.serving.dynamic_service import DynamicService
from handler.serving.live import Incoming
from handler.serving.request_fields import Limits
from tests.support.recording_sink import RecordingSink
from tests.support.service_driver import drive

LIMITS = Limits(max_seq_len=128, max_new_tokens_cap=64, default_max_new_tokens=8, served_model_name="llm")


@pytest.fixture(scope="module")
def engine(default_checkpoint):
    # Float weights: these tests compare a request's tokens in a batch with its tokens alone, which
    # quantized weights do not promise (one row rounds x to int8, several rows do not: kernels/quantized.c).
    cfg = EngineConfig(default_checkpoint, dtype="float32", compile="eager", max_batch_size=4, max_seq_len=128,
                       quantization="none")
    return build_engine(cfg).engine


def req(prompt="The sky is", n=6, stream=False, **extra):
    return {"prompt": prompt, "max_new_tokens": n, "stream": stream, **extra}


def test_streaming_pieces_join_to_the_whole_answer(engine):
    service = ContinuousService(engine, LIMITS, RecordingSink())
    whole = drive(service, [Incoming("a", req(), True)])["a"]
    streamed = drive(service, [Incoming("b", req(stream=True), True)])["b"]
    assert len(whole) > 1 and whole[:-1] == [None] * (len(whole) - 1), "held until its end"
    assert whole[-1].more is None, "a non-streaming client gets one whole response"
    lines = [json.loads(line) for r in streamed for line in r.body.splitlines()]
    assert "".join(p["text"] for p in lines) == json.loads(whole[-1].body)["text"]
    assert lines[-1]["finish_reason"] == "length" and lines[-1]["usage"]["completion_tokens"] == 6
    assert [r.more for r in streamed][-1] is False and all(r.more for r in streamed[:-1])


def test_request_finishing_in_its_first_call_is_a_whole_response(engine):
    service = ContinuousService(engine, LIMITS, RecordingSink())
    [reply] = drive(service, [Incoming("a", req(n=1, stream=True), True)])["a"]
    assert reply.more is None and reply.status == 200


def test_bad_request_in_a_batch_does_not_hurt_the_others(engine):
    service = ContinuousService(engine, LIMITS, RecordingSink())
    replies = drive(service, [Incoming("good", req(), True), Incoming("bad", {"prompt": ""}, True),
                              Incoming("good2", req("Hello"), True)])
    assert replies["bad"][0].status == 400 and replies["bad"][0].more is None
    assert "empty" in json.loads(replies["bad"][0].body)["error"]["message"]
    for rid in ("good", "good2"):
        assert json.loads(replies[rid][-1].body)["finish_reason"] == "length"


def test_grpc_requests_are_held_until_their_end_while_http_streams_go_on(engine):
    """TorchServe 0.12 ends a gRPC call at its first reply in continuous mode (unary) or drops
    it (stream): it gets no reply until its last, and a concurrent HTTP stream gets a piece a call."""
    service = ContinuousService(engine, LIMITS, RecordingSink())
    first = service.handle([Incoming("http", req(n=20, stream=True), True)])
    together = drive(service, [Incoming("http", None, True), Incoming("grpc", req(n=6), False)])
    held, last = together["grpc"][:-1], together["grpc"][-1]
    assert len(held) == 5 and held == [None] * 5 and all(r.more for r in together["http"][:6])
    assert last.more is False and json.loads(last.body)["usage"]["completion_tokens"] == 6
    pieces = [json.loads(line) for r in [*first, *together["http"]] for line in r.body.splitlines()]
    assert pieces[-1]["usage"]["completion_tokens"] == 20
    alone = drive(ContinuousService(engine, LIMITS, RecordingSink()), [Incoming("x", req(n=20), True)])["x"]
    assert "".join(p["text"] for p in pieces) == json.loads(alone[-1].body)["text"]


def test_a_request_the_frontend_stops_sending_is_cancelled(engine):
    sink = RecordingSink()
    service = ContinuousService(engine, LIMITS, sink)
    service.handle([Incoming("gone", req(n=30, stream=True), True)])
    assert engine.running == 1
    service.handle([Incoming("new", req(n=2), True)])
    assert "gone" not in service.stages.live and ("ts_llm_request_failure_total", 1, "cancelled") in sink.values
    drive(service, [Incoming("new", None, True)])
    assert engine.running == 0


def test_draining_refuses_new_requests_but_finishes_running_ones(engine):
    draining = False
    service = ContinuousService(engine, LIMITS, RecordingSink(), draining=lambda: draining)
    service.handle([Incoming("old", req(n=5, stream=True), True)])
    draining = True
    out = service.handle([Incoming("old", None, True), Incoming("new", req(), True)])
    assert out[1].status == 503 and "retry" in json.loads(out[1].body)["error"]["message"]
    rest = drive(service, [Incoming("old", None, True)])["old"]
    assert json.loads(rest[-1].body.splitlines()[-1])["finish_reason"] == "length"


def test_a_cut_ends_a_stream_with_a_retryable_error_event_and_a_held_answer_with_a_503(engine):
    cutting = False
    service = ContinuousService(engine, LIMITS, RecordingSink(), cutting=lambda: cutting)
    first = service.handle([Incoming("s", req(n=20, stream=True), True), Incoming("w", req(n=20), True)])
    assert first[0].more is True and first[1] is None
    cutting = True
    replies = service.handle([Incoming("s", None, True), Incoming("w", req(n=20), True), Incoming("new", req(), True)])
    error = json.loads(replies[0].body.splitlines()[-1])["error"]
    assert replies[0].more is False and error["code"] == 503 and "retry on another replica" in error["message"]
    assert replies[1].status == 503 and replies[1].more is None, "a held answer's cut is a whole 503: a balancer retries it"
    assert "retry on another replica" in json.loads(replies[1].body)["error"]["message"]
    assert replies[2].status == 503 and replies[2].more is None, "nothing new is admitted"
    assert engine.running == 0 and not service.stages.live


def test_a_cut_request_that_sent_nothing_gets_a_503(engine):
    steps = iter(range(100))
    service = DynamicService(engine, LIMITS, RecordingSink(), cutting=lambda: next(steps) >= 2)
    [reply] = service.handle([Incoming("w", req(n=20), True)], lambda partial: None)
    assert reply.status == 503 and reply.more is None
    assert "shutting down" in json.loads(reply.body)["error"]["message"] and engine.running == 0


def test_metrics_cover_the_request_lifecycle(engine):
    sink = RecordingSink()
    drive(ContinuousService(engine, LIMITS, sink), [Incoming("a", req(n=4), True)])
    assert len(sink.of("ts_llm_time_to_first_token_seconds")) == 1
    assert sum(sink.of("ts_llm_generation_tokens_total")) == 4
    assert ("ts_llm_request_success_total", 1, "length") in sink.values
    assert len(sink.of("ts_llm_e2e_request_latency_seconds")) == 1


def test_times_the_threads_went_on_alone_are_counted_as_they_happen(engine):
    # the pool's count only grows; each step reports what it added since the last one
    counts = itertools.chain([7, 7, 9], itertools.repeat(12))
    sink = RecordingSink()
    drive(ContinuousService(engine, LIMITS, sink, times_alone=lambda: next(counts)), [Incoming("a", req(n=3), True)])
    assert sink.of("ts_llm_engine_threads_alone_total")[:3] == [0, 2, 3]
    assert sum(sink.of("ts_llm_engine_threads_alone_total")) == 5


def test_batch_occupancy_is_a_fraction_of_the_slots(engine):
    sink = RecordingSink()
    drive(ContinuousService(engine, LIMITS, sink), [Incoming("a", req(n=3), True)])
    assert sink.of("ts_llm_batch_occupancy_ratio")[0] == 1 / engine.slots


def test_dynamic_mode_streams_through_the_callback_and_returns_finals(engine):
    sent: list[dict] = []
    service = DynamicService(engine, LIMITS, RecordingSink())
    batch = [Incoming("s", req(n=5, stream=True), True), Incoming("w", req(n=5), True), Incoming("bad", {"x": 1}, True)]
    finals = service.handle(batch, sent.append)
    assert sent and all(set(p) == {0} for p in sent), "only the streaming request gets partial replies"
    pieces = [json.loads(line) for p in sent for line in p[0].body.splitlines()] + \
             [json.loads(line) for line in finals[0].body.splitlines()]
    assert "".join(p["text"] for p in pieces) == json.loads(finals[1].body)["text"]
    assert finals[2].status == 400 and engine.running == 0


def test_dynamic_mode_ends_a_grpc_stream_answered_in_one_step(engine):
    finals = DynamicService(engine, LIMITS, RecordingSink()).handle([Incoming("g", req(n=1, stream=True), False)], [].append)
    assert finals[0].more is False  # without it TorchServe's frontend fails the worker


def test_streamed_logprobs_join_to_the_whole_answers(engine):
    """Each streamed piece carries the log-probabilities of the tokens since the previous one
    (held-back text included), so together they are the whole answer's, one per token."""
    body = {"prompt": "The sky is", "max_tokens": 8, "temperature": 0, "logprobs": 2}
    service = ContinuousService(engine, LIMITS, RecordingSink())
    whole = json.loads(drive(service, [Incoming("a", body, True, "v1/completions")])["a"][-1].body)
    streamed = drive(service, [Incoming("b", body | {"stream": True}, True, "v1/completions")])["b"]
    pieces = [json.loads(line[6:]) for r in streamed for line in r.body.split("\n") if line.startswith("data: {")]
    lps = [p["choices"][0]["logprobs"] for p in pieces if p["choices"]]
    expected = whole["choices"][0]["logprobs"]
    assert len(expected["tokens"]) == whole["usage"]["completion_tokens"] == 8
    for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
        assert [v for lp in lps for v in lp[key]] == expected[key], key
    assert "".join(expected["tokens"]) == whole["choices"][0]["text"]


def _choices(replies) -> dict[int, str]:
    return {c["index"]: c["text"] for c in json.loads(replies[-1].body)["choices"]}


def test_n_completions_are_each_the_request_with_its_own_seed(engine):
    body = {"prompt": "The sky is", "max_tokens": 8, "temperature": 1.0, "seed": 11}
    service = ContinuousService(engine, LIMITS, RecordingSink())
    together = drive(service, [Incoming("n", body | {"n": 3}, True, "v1/completions")])["n"]
    alone = [_choices(drive(service, [Incoming(f"s{i}", body | {"seed": 11 + i}, True, "v1/completions")])[f"s{i}"])[0]
             for i in range(3)]
    assert _choices(together) == dict(enumerate(alone))
    assert len(set(alone)) == 3
    assert json.loads(together[-1].body)["usage"]["completion_tokens"] == 24


def test_streamed_choices_join_to_the_whole_answers(engine):
    body = {"prompt": "Roses are", "max_tokens": 6, "temperature": 1.0, "seed": 3, "n": 2}
    service = ContinuousService(engine, LIMITS, RecordingSink())
    whole = _choices(drive(service, [Incoming("w", body, True, "v1/completions")])["w"])
    streamed = drive(service, [Incoming("s", body | {"stream": True}, True, "v1/completions")])["s"]
    sse = "".join(r.body for r in streamed)
    pieces = [json.loads(line[6:]) for line in sse.split("\n") if line.startswith("data: {")]
    texts: dict[int, str] = {}
    for p in pieces:
        for c in p["choices"]:
            texts[c["index"]] = texts.get(c["index"], "") + c["text"]
    assert texts == whole and sse.count("[DONE]") == 1 and sse.endswith("data: [DONE]\n\n")


def test_a_request_whose_samples_do_not_fit_waits_for_slots(engine):
    """Slots are 4: with one taken, n=4 waits (held) until the running request ends."""
    service = ContinuousService(engine, LIMITS, RecordingSink())
    first = service.handle([Incoming("running", req(n=3, stream=True), True)])
    assert first[0].more is True
    waiting = {"prompt": "Hi", "max_tokens": 3, "temperature": 1.0, "seed": 1, "n": 4}
    replies = drive(service, [Incoming("running", None, True), Incoming("n4", waiting, True, "v1/completions")])
    assert replies["n4"][0] is None
    assert sorted(_choices(replies["n4"])) == [0, 1, 2, 3]
    assert json.loads(replies["n4"][-1].body)["usage"]["completion_tokens"] == 12


def test_a_schema_request_answers_json_and_is_counted(engine):
    sink = RecordingSink()
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": {"enum": ["yes", "no"]}}}
    replies = drive(ContinuousService(engine, LIMITS, sink),
                    [Incoming("a", {"model": "llm", "prompt": "Is the sky blue?", "max_tokens": 8, "response_format": fmt},
                              True, url_path="v1/completions")])["a"]
    body = json.loads(replies[-1].body)
    assert json.loads(body["choices"][0]["text"]) in ("yes", "no") and body["choices"][0]["finish_reason"] == "stop"
    assert sink.of("ts_llm_structured_output_requests_total") == [1]


def test_an_invalid_schema_is_a_400_that_says_why_and_the_batch_goes_on(engine):
    bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/$defs/missing"}}}
    replies = drive(ContinuousService(engine, LIMITS, RecordingSink()),
                    [Incoming("bad", req(response_format=bad), True), Incoming("good", req(), True)])
    assert replies["bad"][0].status == 400
    assert "`response_format`: invalid JSON schema" in json.loads(replies["bad"][0].body)["error"]["message"]
    assert json.loads(replies["good"][-1].body)["text"]


def test_a_repeated_prompt_is_counted_as_prefix_cache_hits(engine):
    sink = RecordingSink()
    service = ContinuousService(engine, LIMITS, sink)
    prompt = "You are a terse assistant who answers every question about rivers in one sentence. Which is longest?"
    first = drive(service, [Incoming("a", req(prompt), True)])["a"]
    again = drive(service, [Incoming("b", req(prompt), True)])["b"]
    assert json.loads(again[-1].body)["text"] == json.loads(first[-1].body)["text"]
    prompt_tokens = sink.of("ts_llm_prompt_tokens_total")
    assert json.loads(again[-1].body)["usage"]["prompt_tokens_details"] == {"cached_tokens": prompt_tokens[1] - 1}
    assert sink.of("ts_llm_prefix_cache_hit_tokens_total") == [0, prompt_tokens[1] - 1], "all but the last token"


def test_abandoned_requests_leave_the_engine_and_the_service(engine):
    # the handler's error boundary: a batch that failed is forgotten, the others keep running
    service = ContinuousService(engine, LIMITS, RecordingSink())
    service.handle([Incoming("a", req(n=20, stream=True), True), Incoming("b", req(n=20, stream=True), True)])
    service.abandon(["a"])
    assert set(service.stages.live) == {"b"} and engine.running == 1
    service.abandon(["b"])  # the module's engine, empty for the next test


def test_a_held_stream_sends_a_keep_alive_comment_after_15_s_of_silence(engine):
    """A constrained tool answer is held whole until its end (tool_calls.py): without bytes, a
    proxy's idle timeout would close the stream. Each call here takes 5 s on the service's clock."""
    now = [0.0]
    body = {"model": "llm", "messages": [{"role": "user", "content": "Time?"}], "max_tokens": 26, "stream": True,
            "tools": [{"type": "function", "function": {"name": "now"}}], "tool_choice": "required",
            "parallel_tool_calls": False, "temperature": 0}
    service = ContinuousService(engine, LIMITS, RecordingSink(), clock=lambda: now[0])
    replies = [service.handle([Incoming("t", body, True, "v1/chat/completions")])[0]]
    while replies[-1].more:
        now[0] += 5.0
        replies += service.handle([Incoming("t", None, True, "v1/chat/completions")])
    held = [r.body for r in replies[:-1]]
    comments = [i for i, b in enumerate(held) if b]
    assert comments and all(held[i] == ": keep-alive\n\n" for i in comments)
    assert all(b - a == 3 for a, b in itertools.pairwise(comments)), "one comment each 15 s of silence"
    assert '"tool_calls"' in replies[-1].body
