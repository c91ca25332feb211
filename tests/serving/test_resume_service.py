"""A stream cut by the drain resumes on another replica (another service over the same store),
driven as TorchServe drives it, on the real engine: the joined stream equals an uninterrupted
run (greedy on SSE, seeded on NDJSON), every event carries its resume point, and a resume that
cannot be served is a clear 4xx."""
from __future__ import annotations

import json
import time

import pytest

from handler.cache.local import LocalStore
from handler.cache.signing import ManifestVerifier, Signing
from handler.engine.config import EngineConfig
from handler.engine.factory import build_engine
from handler.engine.sampling import SamplingParams
from handler.resume.ids import new_key, parse_event_id, public_id
from handler.resume.record import RecordedSample, ResumeRecord
from handler.resume.records import ExpiryPolicy, ResumeRecords, record_name
from handler.resume.seal import FleetKeySeal, SecretSeal
from handler.serving.continuous_service import ContinuousService
from handler.serving.live import Incoming
from handler.serving.request_fields import Limits
from tests.support.recording_sink import RecordingSink
from tests.support.service_driver import drive

LIMITS = Limits(max_seq_len=128, max_new_tokens_cap=64, default_max_new_tokens=8, served_model_name="llm",
                vocab_size=49152)
SSE_BODY = {"model": "llm", "prompt": "The three primary colors are", "max_tokens": 12, "temperature": 0, "stream": True}
NDJSON_BODY = {"prompt": "Once upon a time", "max_new_tokens": 12, "temperature": 0.9, "seed": 3, "stream": True,
               "ignore_eos": True}


@pytest.fixture(scope="module")
def engine(default_checkpoint):
    cfg = EngineConfig(default_checkpoint, dtype="float32", compile="eager", max_batch_size=2, max_seq_len=128,
                       quantization="none")
    return build_engine(cfg).engine


@pytest.fixture
def records(tmp_path):
    return ResumeRecords(LocalStore(tmp_path / "store", progress=False), SecretSeal(b"fleet secret " * 3),
                         ExpiryPolicy(ttl_s=60, max_records=10))


def sse_events(bodies):
    """Each event's fields ({"id": ..., "data": ..., "retry": ...}) in order."""
    events = []
    for block in "".join(bodies).split("\n\n"):
        if block.strip():
            events.append(dict(line.split(": ", 1) for line in block.splitlines()))
    return events


def sse_text(events):
    return "".join(json.loads(e["data"])["choices"][0]["text"] for e in events
                   if e["data"] != "[DONE]" and "choices" in json.loads(e["data"]))


def cut_after(engine, records, body, path, calls=3):
    """A replica that serves `calls` calls of the stream, then is cut: the bodies it sent."""
    cutting = False
    service = ContinuousService(engine, LIMITS, RecordingSink(), cutting=lambda: cutting, records=records)
    replies = [service.handle([Incoming("s", body, True, path)])[0]]
    for _ in range(calls - 1):
        replies += service.handle([Incoming("s", None, True, path)])
    assert all(r.more for r in replies), "the stream was still running before the cut"
    cutting = True
    [last] = service.handle([Incoming("s", None, True, path)])
    assert last.more is False and engine.running == 0
    return [r.body for r in [*replies, last]]


def test_a_cut_sse_stream_resumes_with_last_event_id_and_joins_to_the_uninterrupted_run(engine, records):
    path = "v1/completions"
    ref = drive(ContinuousService(engine, LIMITS, RecordingSink(), records=records), [Incoming("ref", SSE_BODY, True, path)])
    reference = sse_text(sse_events(r.body for r in ref["ref"]))
    events = sse_events(cut_after(engine, records, SSE_BODY, path))
    final = events[-1]
    error = json.loads(final["data"])["error"]
    assert final["retry"] == "1000" and error["resume"] == final["id"] and error["code"] == 503
    assert all("id" in e for e in events), "every event carries its resume point"
    point = parse_event_id(final["id"])
    assert point.points == (len(sse_text(events)),) and records.store.read_record(record_name(point.key)) is not None

    resumed = drive(ContinuousService(engine, LIMITS, RecordingSink(), records=records),
                    [Incoming("r", SSE_BODY, True, path, last_event_id=final["id"])])["r"]
    more = sse_events(r.body for r in resumed)
    assert sse_text(events) + sse_text(more) == reference
    assert {json.loads(e["data"])["id"] for e in events + more if e["data"] != "[DONE]" and "choices" in e["data"]} \
        == {f"cmpl-{public_id(point.key)}"}, "one stream: the same envelope id on every replica"
    assert not any(point.key in e["data"] for e in events[:-1] + more), "the resume key is not in any body"
    assert parse_event_id(more[-1]["id"]).points == (len(reference) + 1,), "its end was sent: one past its text"


def test_a_cut_seeded_ndjson_stream_resumes_with_the_resume_field(engine, records):
    ref = drive(ContinuousService(engine, LIMITS, RecordingSink(), records=records), [Incoming("ref", NDJSON_BODY, True)])
    reference = "".join(json.loads(line)["text"] for r in ref["ref"] for line in r.body.splitlines())
    lines = [json.loads(line) for body in cut_after(engine, records, NDJSON_BODY, "") for line in body.splitlines()]
    sent = "".join(line.get("text", "") for line in lines)
    assert all("resume" in line for line in lines) and lines[-1]["error"]["resume"] == lines[-1]["resume"]

    resumed = drive(ContinuousService(engine, LIMITS, RecordingSink(), records=records),
                    [Incoming("r", {"resume": lines[-1]["resume"]}, True)])["r"]
    more = [json.loads(line) for r in resumed for line in r.body.splitlines()]
    assert sent + "".join(m["text"] for m in more) == reference
    usage = more[-1]["usage"]
    assert usage["completion_tokens"] == 12, "usage counts the whole generation"
    # the resumed engine prompt (the client's and the 12 - n tokens sent) came from the prefix
    # cache; the client's usage counts cached tokens of its own prompt only
    assert usage["prompt_tokens_details"]["cached_tokens"] == usage["prompt_tokens"]


def test_a_cut_grpc_call_says_where_to_resume_and_its_resume_answers_the_whole_text(engine, records):
    """A gRPC call is held until its end (no reply a call), so its client holds nothing at the cut:
    the resume id's point is 0 and the resumed call's one reply is the whole answer, as lines."""
    body = {**NDJSON_BODY, "stream": False}
    ref = drive(ContinuousService(engine, LIMITS, RecordingSink(), records=records), [Incoming("ref", body, False)])
    reference = json.loads(ref["ref"][-1].body)["text"]
    cutting = False
    service = ContinuousService(engine, LIMITS, RecordingSink(), cutting=lambda: cutting, records=records)
    held = [service.handle([Incoming("g", body, False)])[0] for _ in range(3)]
    assert held == [None] * 3 and engine.running == 1
    cutting = True
    [cut] = service.handle([Incoming("g", body, False)])
    error = json.loads(cut.body)["error"]
    assert cut.more is False and error["code"] == 503 and parse_event_id(error["resume"]).points == (0,)

    resumed = drive(ContinuousService(engine, LIMITS, RecordingSink(), records=records),
                    [Incoming("r", {"resume": error["resume"]}, False)])["r"]
    assert resumed[:-1] == [None] * (len(resumed) - 1) and resumed[-1].more is False
    lines = [json.loads(line) for line in resumed[-1].body.splitlines()]
    assert "".join(m["text"] for m in lines) == reference and lines[-1]["usage"]["completion_tokens"] == 12


def refusal(engine, records, inc):
    [reply] = ContinuousService(engine, LIMITS, RecordingSink(), records=records).handle([inc])
    return reply.status, json.loads(reply.body)["error"]["message"]


def test_resumes_that_cannot_be_served_are_clear_4xx(engine, records):
    unknown = f"{new_key()}.0"
    status, message = refusal(engine, records, Incoming("a", {"resume": unknown}, True))
    assert status == 404 and "no cut stream" in message
    long_ago = f"{new_key(now=1_000_000)}.0"
    status, message = refusal(engine, records, Incoming("b", {"resume": long_ago}, True))
    assert status == 410 and "expired" in message
    status, message = refusal(engine, records, Incoming("c", {"resume": "not-an-id"}, True))
    assert status == 400 and "not an event id" in message


def test_an_expired_record_is_410_and_a_resume_on_another_route_is_400(engine, records):
    [final] = sse_events(cut_after(engine, records, SSE_BODY, "v1/completions", calls=2)[-1:])
    status, message = refusal(engine, records, Incoming("a", {}, True, "v1/chat/completions", last_event_id=final["id"]))
    assert status == 400 and "same route" in message
    later = ResumeRecords(records.store, records.seal, records.policy, clock=lambda: records.clock() + 61)
    status, message = refusal(engine, later, Incoming("b", SSE_BODY, True, "v1/completions", last_event_id=final["id"]))
    assert status == 410 and "resume_ttl_s" in message


def test_a_replica_that_cannot_sign_its_records_ends_cut_streams_as_before(engine, tmp_path):
    """It verifies records (the fleet's public key) without the private key: what it wrote would be
    refused everywhere, so it writes nothing and says retry, not resume."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    signing = Signing(verifier=ManifestVerifier(Ed25519PrivateKey.generate().public_key()))
    records = ResumeRecords(LocalStore(tmp_path, progress=False), FleetKeySeal(signing), ExpiryPolicy())
    final = cut_after(engine, records, NDJSON_BODY, "", calls=2)[-1].splitlines()[-1]
    error = json.loads(final)["error"]
    assert "resume" not in error and "retry on another replica" in error["message"]
    assert records.store.list_records("resume/") == []


def choice_texts(events, n):
    """Each choice's streamed text (completions), by index."""
    texts = [""] * n
    for e in events:
        if e["data"] != "[DONE]" and "choices" in (data := json.loads(e["data"])):
            for c in data["choices"]:
                texts[c["index"]] += c["text"]
    return texts


def test_a_cut_stream_of_two_seeded_samples_resumes_each_where_its_client_stands(engine, records):
    body = {"model": "llm", "prompt": "Once upon a time", "max_tokens": 12, "temperature": 0.9, "seed": 11, "n": 2,
            "stream": True, "ignore_eos": True}
    path = "v1/completions"
    ref = drive(ContinuousService(engine, LIMITS, RecordingSink(), records=records), [Incoming("ref", body, True, path)])
    reference = choice_texts(sse_events(r.body for r in ref["ref"]), 2)
    assert reference[0] != reference[1]
    events = sse_events(cut_after(engine, records, body, path))
    point = parse_event_id(events[-1]["id"])
    assert point.points == tuple(len(t) for t in choice_texts(events, 2)), "a point per sample"

    resumed = drive(ContinuousService(engine, LIMITS, RecordingSink(), records=records),
                    [Incoming("r", {}, True, path, last_event_id=events[-1]["id"])])["r"]
    more = sse_events(r.body for r in resumed)
    assert [a + b for a, b in zip(choice_texts(events, 2), choice_texts(more, 2))] == reference


def test_a_cut_constrained_tool_stream_resumes_to_the_same_call(engine, records):
    """The generic format holds a tool answer whole (tool_calls.py): the client has nothing but the
    cut's event, and the resumed stream's call is the one the uncut stream made."""
    body = {"model": "llm", "messages": [{"role": "user", "content": "Time?"}], "max_tokens": 26,
            "tools": [{"type": "function", "function": {"name": "now"}}],  # the engine's context is 128 tokens
            "tool_choice": "required", "parallel_tool_calls": False, "temperature": 0.8, "seed": 4, "stream": True}
    path = "v1/chat/completions"

    def calls(events):
        return [(c["function"]["name"], c["function"]["arguments"]) for e in events
                if e["data"] != "[DONE]" and "choices" in (data := json.loads(e["data"]))
                for ch in data["choices"] for c in ch["delta"].get("tool_calls", [])]

    ref = drive(ContinuousService(engine, LIMITS, RecordingSink(), records=records), [Incoming("ref", body, True, path)])
    reference = calls(sse_events(r.body for r in ref["ref"]))
    assert len(reference) == 1
    events = sse_events(cut_after(engine, records, body, path))
    assert calls(events) == []
    resumed = drive(ContinuousService(engine, LIMITS, RecordingSink(), records=records),
                    [Incoming("r", {}, True, path, last_event_id=events[-1]["id"])])["r"]
    more = sse_events(r.body for r in resumed)
    assert calls(more) == reference
    assert [json.loads(e["data"])["choices"][0]["finish_reason"] for e in more if "finish_reason" in e["data"]][-1] \
        == "tool_calls"


def test_a_sample_that_finished_before_the_cut_sends_only_what_its_client_missed(engine, records):
    """Sample 0 had finished ("stop") and its client holds 3 of its characters; sample 1 was cut
    running. The resume sends sample 0's rest and its end, and generates sample 1 on."""
    tok = engine.tokenizer
    finished, running = tok.encode(" red, blue and yellow."), tok.encode(" cyan")
    text = tok.decode(finished)
    key = new_key()
    records.put(ResumeRecord(key, "llm", "completions", time.time(), tuple(tok.encode(SSE_BODY["prompt"])),
                             (RecordedSample(tuple(finished), len(text) + 1, None, "stop"),
                              RecordedSample(tuple(running), len(tok.decode(running)))),
                             SamplingParams(max_new_tokens=8, ignore_eos=True)))
    resumed = drive(ContinuousService(engine, LIMITS, RecordingSink(), records=records),
                    [Incoming("r", {}, True, "v1/completions", last_event_id=f"{key}.3.{len(tok.decode(running))}")])["r"]
    events = sse_events(r.body for r in resumed)
    first, rest = choice_texts(events, 2)
    assert first == text[3:] and rest
    ends = [(c["index"], c["finish_reason"]) for e in events if e["data"] != "[DONE]"
            for c in json.loads(e["data"])["choices"] if c["finish_reason"]]
    assert ends == [(0, "stop"), (1, "length")]
    final = parse_event_id(events[-1]["id"]).points
    assert final == (len(text) + 1, len(tok.decode(running)) + len(rest) + 1)


def test_an_id_that_does_not_fit_its_record_is_a_400_and_tools_that_do_not_parse_a_404(engine, records):
    tok = engine.tokenizer
    prompt, ids = tuple(tok.encode(SSE_BODY["prompt"])), tuple(tok.encode(" red"))
    two = ResumeRecord(new_key(), "llm", "completions", time.time(), prompt,
                       (RecordedSample(ids, 4), RecordedSample(ids, 4)), SamplingParams(max_new_tokens=8))
    records.put(two)
    status, message = refusal(engine, records, Incoming("a", {}, True, "v1/completions", last_event_id=f"{two.key}.4"))
    assert status == 400 and "has 1 points" in message and "has 2 samples" in message
    status, message = refusal(engine, records, Incoming("b", {}, True, "v1/completions", last_event_id=f"{two.key}.4.5"))
    assert status == 400 and "past what stream" in message and "(4.4)" in message
    twice = {"type": "function", "function": {"name": "f"}}  # a name twice: parse_tools refuses it
    tools = ResumeRecord(new_key(), "llm", "chat", time.time(), prompt, (RecordedSample(ids, 4),),
                         SamplingParams(max_new_tokens=8), tools={"tools": [twice, twice]})
    records.put(tools)
    status, message = refusal(engine, records, Incoming("c", {}, True, "v1/chat/completions",
                                                        last_event_id=f"{tools.key}.4"))
    assert status == 404 and "tools do not parse here" in message
