"""Resumable streams through a real TorchServe: two replicas of the model (two workers, each with
its own drain flag) share one resume store (a directory). Replica A is cut as the sidecar cuts it
(the drain flag gets `cut_since_epoch`); its SSE and NDJSON streams end with an event that says
where to resume, and replica B goes on from there (the `Last-Event-ID` header, the native
`resume` field): the joined streams equal B's uninterrupted greedy run. A non-streaming answer cut
on A is a whole 503, which a balancer sends again to B."""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import requests

from handler.packing.archive import build_mar
from handler.packing.model_config import ServingOptions
from handler.resume.ids import new_key, parse_event_id
from handler.sidecar.drain.admission import flag_cutter
from handler.torchserve.launch import Ports, start_torchserve

REPO = Path(__file__).resolve().parents[2]
SERVED = "llm"
TOKENS = 96  # long enough to be running still when the cut comes
SSE = {"model": SERVED, "prompt": "Write a long story about a lighthouse keeper.", "max_tokens": TOKENS,
       "temperature": 0, "stream": True, "ignore_eos": True}
WHOLE = {"model": SERVED, "prompt": "Write a long story about a storm at sea.", "max_tokens": 128, "temperature": 0,
         "ignore_eos": True}
NATIVE = {"prompt": "List the planets of the solar system, one per line:", "max_new_tokens": TOKENS, "stream": True,
          "ignore_eos": True}

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def replicas(tmp_path_factory, default_checkpoint):
    """(TorchServe, A's drain flag): models `a` and `b`, one resume store."""
    tmp = tmp_path_factory.mktemp("resume_e2e")
    store = tmp / "model_store"
    secret = tmp / "resume-secret"  # the fleet's, as the deployment mounts it: records are sealed
    secret.write_text("a fleet secret of more than thirty-two bytes\n")
    for name in ("a", "b"):
        handler = {"dtype": "bfloat16", "compile": "eager", "max_seq_len": 256, "max_new_tokens_cap": 128, "default_max_new_tokens": 16,
                   "served_model_name": SERVED, "drain_flag_file": str(tmp / name / "draining"),
                   "resume_store": str(tmp / "resume-store"), "resume_secret_file": str(secret)}
        build_mar(default_checkpoint, name, store, ServingOptions("continuous", batch_size=4, handler=handler))
    ts = start_torchserve(store, {"a": "a.mar", "b": "b.mar"}, REPO / "config.properties", tmp / "work", Ports.free())
    try:
        ts.wait_ready("a", timeout=180)
        ts.wait_ready("b", timeout=180)
        yield ts, tmp / "a" / "draining"
    finally:
        ts.stop()


def post(ts, model: str, route: str, body: dict, **headers: str) -> requests.Response:
    url = f"{ts.inference_url}/predictions/{model}" + (f"/1.0/{route}" if route else "")
    return requests.post(url, json=body, headers=ts.headers() | headers, stream=True, timeout=120)


def lines_of(response: requests.Response):
    """One iterator per response: requests cannot restart one, and a test reads a stream in two goes."""
    return response.iter_lines(decode_unicode=True)


def sse_events(lines, stop_after: int | None = None) -> list[dict[str, str]]:
    events, fields = [], {}
    for line in lines:
        if line:
            name, _, value = line.partition(": ")
            fields[name] = value
            continue
        if fields:
            events.append(fields)
            fields = {}
        if stop_after is not None and len(events) >= stop_after:
            break
    return events


def sse_text(events) -> str:
    datas = [json.loads(e["data"]) for e in events if e.get("data", "[DONE]") != "[DONE]"]
    return "".join(d["choices"][0]["text"] for d in datas if d.get("choices"))


def ndjson(lines, stop_after: int | None = None) -> list[dict]:
    out = []
    for line in lines:
        if line:
            out.append(json.loads(line))
        if stop_after is not None and len(out) >= stop_after:
            break
    return out


def test_streams_cut_on_one_replica_resume_on_another(replicas):
    ts, flag = replicas
    reference_sse = sse_text(sse_events(lines_of(post(ts, "b", "v1/completions", SSE))))
    reference_native = "".join(line["text"] for line in ndjson(lines_of(post(ts, "b", "", NATIVE))))

    sse, native = lines_of(post(ts, "a", "v1/completions", SSE)), lines_of(post(ts, "a", "", NATIVE))
    events, lines = sse_events(sse, stop_after=3), ndjson(native, stop_after=3)
    flag_cutter(flag)()  # the sidecar's end of the in-flight wait
    events += sse_events(sse)
    lines += ndjson(native)
    assert all("id" in e for e in events) and all("resume" in line for line in lines)
    last_event, last_line = events[-1], lines[-1]
    assert "retry" in last_event, events[-3:]
    assert json.loads(last_event["data"])["error"]["resume"] == last_event["id"]
    assert last_line["error"]["code"] == 503 and last_line["error"]["resume"] == last_line["resume"]
    assert len(sse_text(events)) < len(reference_sse), "cut before it finished"

    resumed_sse = sse_events(lines_of(post(ts, "b", "v1/completions", SSE, **{"Last-Event-ID": last_event["id"]})))
    assert sse_text(events) + sse_text(resumed_sse) == reference_sse
    resumed_native = ndjson(lines_of(post(ts, "b", "", {"resume": last_line["resume"]})))
    sent = "".join(line.get("text", "") for line in lines)
    assert sent + "".join(line["text"] for line in resumed_native) == reference_native
    assert resumed_native[-1]["finish_reason"] == "length" and resumed_native[-1]["usage"]["completion_tokens"] == TOKENS
    assert parse_event_id(resumed_native[-1]["resume"]).key == parse_event_id(last_line["resume"]).key


def test_a_resume_for_an_unknown_or_expired_stream_is_404_or_410(replicas):
    ts, _ = replicas
    unknown = post(ts, "b", "", {"resume": f"{new_key()}.0"})
    assert unknown.status_code == 404 and "no cut stream" in unknown.json()["error"]["message"]
    expired = post(ts, "b", "v1/completions", SSE, **{"Last-Event-ID": f"{new_key(now=1_000_000)}.0"})
    assert expired.status_code == 410 and "expired" in expired.json()["error"]["message"]


def test_a_cut_non_streaming_answer_is_a_whole_503_that_another_replica_answers(replicas):
    ts, flag = replicas
    flag.unlink(missing_ok=True)  # A serves again (an earlier test may have cut it)
    got: list[requests.Response] = []
    sender = threading.Thread(target=lambda: got.append(post(ts, "a", "v1/completions", WHOLE)))
    sender.start()
    time.sleep(0.5)  # admitted before the stream below, which shows A stepping both (the answer is held)
    beside = lines_of(post(ts, "a", "v1/completions", SSE))
    sse_events(beside, stop_after=3)
    assert sender.is_alive(), "still generating when the cut comes"
    flag_cutter(flag)()
    sse_events(beside)
    sender.join(60)
    flag.unlink()
    [cut] = got
    assert cut.status_code == 503, "a whole 503, not an error under a 200"
    assert "was cut before it finished; retry on another replica" in cut.json()["error"]["message"]
    retried = post(ts, "b", "v1/completions", WHOLE)  # what a balancer that retries 503s sends
    assert retried.status_code == 200 and retried.json()["usage"]["completion_tokens"] == WHOLE["max_tokens"]
