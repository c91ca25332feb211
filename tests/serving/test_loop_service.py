"""LoopService (asyncCommunication mode) on counting steps: driven step by step with run_once,
and once on its own thread."""
from __future__ import annotations

import asyncio
import json
import threading

from handler.engine.engine import Engine
from handler.serving.live import Incoming, Reply
from handler.serving.loop_service import Delivery, LoopService
from handler.serving.request_fields import Limits
from tests.support.recording_sink import RecordingSink
from tests.support.tiny_model import CharTokenizer, CountingSteps, counting_engine

LIMITS = Limits(max_seq_len=64, max_new_tokens_cap=32, default_max_new_tokens=4, served_model_name="llm")


class Recorder:
    """One request's replies, in the order the service handed them over."""

    def __init__(self):
        self.pieces: list[Reply] = []
        self.final: Reply | None = None
        self.done = threading.Event()

    def delivery(self) -> Delivery:
        return Delivery(piece=self.pieces.append, done=self._done)

    def _done(self, reply: Reply) -> None:
        assert self.final is None, "done twice"
        self.final = reply
        self.done.set()


def req(prompt: str = "a", n: int = 3, stream: bool = False, **extra) -> dict:
    return {"prompt": prompt, "max_new_tokens": n, "stream": stream, **extra}


def submit(service: LoopService, request_id: str, body: dict, http: bool = True) -> Recorder:
    rec = Recorder()
    service.submit(Incoming(request_id, body, http), rec.delivery())
    return rec


def run(service: LoopService, *recs: Recorder, max_steps: int = 50) -> None:
    for _ in range(max_steps):
        if all(r.final is not None for r in recs):
            return
        service.run_once()
    raise AssertionError("requests not finished")


def service(slots: int = 4, engine: Engine | None = None, **kwargs) -> LoopService:
    return LoopService(engine or counting_engine(slots)[0], LIMITS, RecordingSink(), **kwargs)


def test_a_whole_answer_is_one_final_reply():
    svc = service()
    rec = submit(svc, "a", req("a", n=3))
    run(svc, rec)
    body = json.loads(rec.final.body)
    assert (body["text"], rec.final.more, rec.pieces) == ("bcd", None, [])


def test_a_stream_is_pieces_then_its_end():
    svc = service()
    rec = submit(svc, "a", req("a", n=3, stream=True))
    run(svc, rec)
    assert [json.loads(p.body)["text"] for p in rec.pieces] == ["b", "c"]
    assert all(p.more is True for p in rec.pieces)
    assert json.loads(rec.final.body)["text"] == "d" and rec.final.more is False


def test_a_grpc_stream_is_answered_whole_in_a_reply_that_ends_it():
    svc = service()
    rec = submit(svc, "a", req("a", n=3, stream=True), http=False)
    run(svc, rec)
    assert rec.pieces == [] and [json.loads(line)["text"] for line in rec.final.body.splitlines()] == ["b", "c", "d"]
    assert rec.final.more is False  # TorchServe completes a gRPC StreamPredictions call only on that


def test_requests_beyond_the_slots_wait_their_turn():
    svc = service(slots=1)
    first, second = submit(svc, "a", req("a", n=3)), submit(svc, "b", req("k", n=2))
    svc.run_once()
    assert svc.stages.engine.running == 1 and first.final is None and second.final is None
    run(svc, first, second)
    assert json.loads(first.final.body)["text"] == "bcd" and json.loads(second.final.body)["text"] == "lm"


def test_the_model_list_is_answered_without_waiting_for_a_slot():
    svc = service(slots=1)
    running = submit(svc, "a", req("a", n=5))
    svc.run_once()
    listing = Recorder()
    svc.submit(Incoming("m", b"", True, "v1/models"), listing.delivery())
    svc.run_once()
    assert running.final is None and listing.final.status == 200
    assert [m["id"] for m in json.loads(listing.final.body)["data"]] == ["llm"]


def test_requests_arriving_mid_stream_join_the_next_step():
    svc = service()
    first = submit(svc, "a", req("a", n=5))
    svc.run_once()
    second = submit(svc, "b", req("k", n=2))
    svc.run_once()
    assert svc.stages.engine.running == 2
    run(svc, first, second)


def test_an_invalid_request_gets_a_400_at_once_and_the_others_are_served():
    svc = service()
    bad, good = submit(svc, "bad", {"prompt": ""}), submit(svc, "good", req("h"))
    svc.run_once()
    assert bad.final.status == 400 and bad.final.more is None
    run(svc, good)
    assert good.final.status == 200


def test_a_draining_replica_refuses_with_a_retryable_503():
    svc = service(draining=lambda: True)
    rec = submit(svc, "a", req())
    svc.run_once()
    assert rec.final.status == 503 and "retry on another replica" in rec.final.body


class FailingOnce(CountingSteps):
    """Decode fails once, on its second call."""

    def decode(self, *args):
        if len(self.of("decode")) == 1 and not self.of("failed decode"):
            self.calls.append(("failed decode", 0, 0))
            raise RuntimeError("boom")
        return super().decode(*args)


def test_a_failing_step_fails_what_was_running_and_the_loop_serves_on():
    steps = FailingOnce()
    svc = service(engine=Engine(steps.prefill, steps.decode, CharTokenizer(), 4, 64, "cpu"))
    whole, stream = submit(svc, "a", req("a", n=3)), submit(svc, "b", req("k", n=3, stream=True))
    svc.run_once()  # one token each, streamed pieces sent
    svc.run_once()  # decode raises
    assert whole.final.status == 500 and whole.final.more is None and "boom" in whole.final.body
    # the stream's 200 was sent: it ends with an error event
    assert stream.final.more is False and json.loads(stream.final.body)["error"]["code"] == 500
    assert svc.stages.engine.running == 0 and svc.stages.live == {}
    after = submit(svc, "c", req("a", n=2))
    run(svc, after)
    assert json.loads(after.final.body)["text"] == "bc"


def test_the_thread_serves_submissions_and_stops():
    svc = service()
    svc.start()
    try:
        recs = [submit(svc, str(i), req(chr(ord("a") + i), n=4, stream=i % 2 == 0)) for i in range(6)]
        assert all(r.done.wait(10) for r in recs)
    finally:
        svc.stop()
    assert not svc._thread.is_alive()
    assert all(r.final.status == 200 for r in recs)


def test_a_cut_ends_running_requests_each_with_a_retryable_error():
    cutting = False
    svc = service(cutting=lambda: cutting)
    stream, whole = submit(svc, "s", req(n=20, stream=True)), submit(svc, "w", req(n=20))
    svc.run_once()
    assert stream.pieces and whole.final is None
    cutting = True
    svc.run_once()
    assert json.loads(stream.final.body.removeprefix("data: "))["error"]["code"] == 503 and stream.final.more is False
    assert whole.final.status == 503 and whole.final.more is None
    assert svc.stages.engine.running == 0 and not svc.stages.live


def test_a_call_is_handled_as_an_awaitable_of_its_last_replies_in_batch_order():
    """asyncCommunication's way in: handle hands each request to the engine thread and returns an
    awaitable of the last replies; streamed pieces go out through send_partial by batch index."""
    svc = service()
    svc.start()
    pieces: list[dict[int, Reply]] = []

    async def call() -> list[Reply]:
        batch = [Incoming("a", req("a", n=3, stream=True), True), Incoming("b", req("x", n=2), True)]
        return await svc.handle(batch, pieces.append)

    try:
        finals = asyncio.run(asyncio.wait_for(call(), timeout=30))
    finally:
        svc.stop()
    assert json.loads(finals[0].body)["text"] == "d" and json.loads(finals[1].body)["text"] == "yz"
    assert [json.loads(p[0].body)["text"] for p in pieces if 0 in p] == ["b", "c"] and all(1 not in p for p in pieces)
