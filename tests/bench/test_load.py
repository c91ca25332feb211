"""The benchmarks' one load client (bench/load.py) and the chaos run's outcomes on it, against a
small server on loopback: what each answer is judged, and what the records keep."""
from __future__ import annotations

import json
import random
import socket
import time
from collections.abc import Iterator

import pytest

from bench import load
from bench.chaos import outcomes
from handler.http_server import Handler, HttpServerThread

WHOLE = json.dumps({"text": "hi", "finish_reason": "length"}).encode()
STREAM = b'{"text": "h"}\n{"text": "i", "finish_reason": "length"}\n'


class Replies(Handler):
    """POST /<status>/<stream|whole|cut>: that status, and that kind of native answer."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        _, status, body = self.path.split("/")
        self.send_body(int(status), "application/json", {"stream": STREAM, "whole": WHOLE}.get(body, b'{"text": "h"}'))

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    http = HttpServerThread("127.0.0.1", 0, Replies, "replies")
    http.start()
    yield f"http://127.0.0.1:{http.port}"
    http.stop()


def judged(url: str, kind: str) -> load.Record:
    record = load.Record(0, time.time(), kind=kind, max_new_tokens=4)
    outcomes.post(outcomes.Target(url, dict), record, load.PROMPTS[0], read_timeout_s=5)
    return record


@pytest.mark.parametrize(("path", "kind", "outcome"), [
    ("/200/stream", "stream", "completed"),
    ("/200/whole", "whole", "completed"),
    ("/200/cut", "stream", "cut_off"),
    ("/503/whole", "whole", "refused_503"),
    ("/500/whole", "whole", "failed_status"),
])
def test_each_answer_is_judged_from_the_client_side(server: str, path: str, kind: str, outcome: str) -> None:
    record = judged(server + path, kind)
    assert record.outcome == outcome
    assert record.status == int(path.split("/")[1]) and record.status_at is not None


def test_nothing_listening_is_a_refused_connection() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    record = judged(f"http://127.0.0.1:{port}/200/whole", "whole")
    assert (record.outcome, record.status) == ("refused_connect", None)
    assert record.error.startswith("ConnectionError")


def test_the_closed_loop_keeps_every_request_until_stopped(server: str) -> None:
    send = outcomes.sender(outcomes.Target(server + "/200/whole", dict), (4, 8))
    loop = load.ClosedLoop(2, send, seed=3).start()
    time.sleep(0.3)
    loop.stop(timeout_s=10)
    records = loop.snapshot()
    assert len(records) >= 2 and {r.client for r in records} == {0, 1}
    assert all(r.end >= r.start and 4 <= r.max_new_tokens <= 8 for r in records)
    assert {r.kind for r in records} <= {"stream", "whole"} and {r.outcome for r in records} == {"completed"}


def test_the_sweep_records_time_to_first_content_and_the_gaps(server: str) -> None:
    records = load.run_load(server + "/200/stream", {}, [{"prompt": p} for p in load.PROMPTS[:3]], 2, stream=True)
    assert len(records) == 3 and all(r.status == 200 and r.error is None for r in records)
    assert all(len(r.chunks) == 2 and r.first == r.chunks[0] for r in records)
    summary = load.summarize(records)
    assert summary["requests"] == 3 and summary["errors"] == 0 and summary["ttft_p50_s"] is not None


def test_finished_needs_a_finish_reason_at_the_end() -> None:
    assert load.finished(STREAM, stream=True) and load.finished(WHOLE, stream=False)
    assert not load.finished(b'{"text": "h"}\n', stream=True)
    assert not load.finished(b"<html>", stream=False)
    assert outcomes.outcome_counts([load.Record(0, 0.0, outcome="completed")])["completed"] == 1


def test_a_closed_loop_pauses_as_its_send_says() -> None:
    calls: list[float] = []

    def send(record: load.Record, rng: random.Random) -> float:
        calls.append(record.start)
        record.outcome = "ok"
        return 10.0

    loop = load.ClosedLoop(1, send).start()
    time.sleep(0.2)
    loop.stop(timeout_s=5)
    assert len(calls) == 1 and loop.snapshot()[0].end > 0.0
