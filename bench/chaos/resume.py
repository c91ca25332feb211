"""Phase 3's long requests, each its own prompt, sent to the replica about to get the spot notice
just before it, long enough to outlive it (so that every one is cut), of five kinds:

- `native`: greedy NDJSON streams (`{"resume": id}` to resume);
- `n2`: seeded SSE completions with n = 2 (`Last-Event-ID` to resume: a point per sample);
- `tools`: greedy SSE chat completions with a tool (the default model's generic format holds the
  answer whole until its end: a cut one has sent nothing but its resume id);
- `grpc`: greedy gRPC `Predictions` calls (the native API), answered whole at their end; a cut one's
  reply is a 503 error body that names its resume id (TorchServe 0.12 sends it under gRPC status
  OK), and the call `{"resume": id}` to the survivor answers the whole text, as lines;
- `non_streaming`: greedy non-streaming completions, sent through HAProxy's `pinned` frontend (its
  first server, the noticed replica, while it is up): a cut one is a whole 503 that HAProxy sends
  again to the survivor, where it runs anew. The client never retries it: a 503 that reaches it is
  a client-visible failure, and it cannot tell a retried answer from another (HAProxy's counts say
  how many were retried).

One that is cut (its last line or event carries `error.resume`) reconnects, through HAProxy (gRPC:
straight to the survivor), as a client of resumable streams does, until it finishes; a 503 (a
draining replica refused it before accepting it) is sent again the same way after the `retry:`
pause. Each joined answer is compared with the same request run uncut on a freshly started
replica (`reference`, gRPC's as the same native body over HTTP), all of them at once: the engine's
answers do not depend on what else is batched with them (docs/benchmarks.md, "Batch invariance"),
so neither the survivor's batches nor the fresh replica's may change a token.

Counting: a cut stream that its client resumes to the end is not a client-visible failure (the
client reconnected, as the final event told it to); one that does not finish is.
"""
from __future__ import annotations

import json
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import requests

from bench.chaos.haproxy import WHOLE_ANSWER_S
from bench.chaos.replica import MODEL
from bench.grpc_stubs import load_inference_stubs

PROMPT = "Write a long story about a lighthouse keeper and the storm that changed everything."
LONG_TOKENS = 600  # at the chaos run's decode speed, longer than the notice's 30 s
RETRY_S = 1.0  # the SSE `retry:` the handler sends
REFERENCE_WAIT_S = 900.0  # the reference's requests beyond the fresh replica's slots wait for whole streams
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]
ROUTES = {"native": "", "n2": "/1.0/v1/completions", "tools": "/1.0/v1/chat/completions",
          "non_streaming": "/1.0/v1/completions", "grpc": ""}


def body(kind: str, prompt: str) -> dict[str, object]:
    if kind == "native":
        return {"prompt": prompt, "max_new_tokens": LONG_TOKENS, "stream": True, "ignore_eos": True}
    if kind == "grpc":
        return {"prompt": prompt, "max_new_tokens": LONG_TOKENS, "ignore_eos": True}
    if kind == "n2":
        return {"model": "llm", "prompt": prompt, "max_tokens": LONG_TOKENS, "n": 2, "temperature": 0.8, "seed": 7,
                "stream": True, "ignore_eos": True}
    if kind == "tools":
        return {"model": "llm", "messages": [{"role": "user", "content": prompt}], "max_tokens": LONG_TOKENS,
                "tools": TOOLS, "temperature": 0, "stream": True}
    return {"model": "llm", "prompt": prompt, "max_tokens": LONG_TOKENS, "temperature": 0, "ignore_eos": True}


@dataclass
class LongStream:
    kind: str
    prompt: str
    texts: dict[int, str] = field(default_factory=dict)  # by choice index
    calls: list[tuple[str, str]] = field(default_factory=list)  # (name, arguments) of tool calls received
    cut: bool = False  # its replica cut it, and said where to resume
    resumed: bool = False  # cut, then finished after a resume
    finished: bool = False
    error: str | None = None

    @property
    def answer(self) -> str:
        """What its client got, joined: each choice's text, then the calls."""
        return "\n--\n".join(self.texts[i] for i in sorted(self.texts)) + json.dumps(self.calls)


def kinds(count: dict[str, int]) -> list[tuple[str, str]]:
    """(kind, prompt) for every long stream: each its own prompt."""
    return [(kind, f"{PROMPT} Story {kind} {i + 1}.") for kind, n in count.items() for i in range(n)]


@dataclass(frozen=True)
class Targets:
    first_url: str  # the noticed replica's .../predictions/llm
    url: str  # HAProxy's: every later request (a resume, a retry)
    pinned_url: str  # HAProxy's `pinned` frontend: the noticed replica while it is up (non_streaming)
    first_grpc: str  # the noticed replica's gRPC inference address (host:port)
    grpc: str  # the survivor's: a cut call's resume


@dataclass
class LongStreams:
    targets: Targets
    count: dict[str, int]  # streams of each kind
    streams: list[LongStream] = field(default_factory=list)
    threads: list[threading.Thread] = field(default_factory=list)

    def start(self, until: float) -> LongStreams:
        stubs = load_inference_stubs(Path(tempfile.mkdtemp(prefix="chaos-grpc-")))
        for i, (kind, prompt) in enumerate(kinds(self.count)):
            self.streams.append(stream := LongStream(kind, prompt))
            self.threads.append(threading.Thread(target=run, args=(self.targets, stubs, stream, until), name=f"long-{i}",
                                                 daemon=True))
        for thread in self.threads:
            thread.start()
        return self

    def join(self, until: float) -> list[LongStream]:
        for thread in self.threads:
            thread.join(max(0.0, until - time.time()))
        return self.streams


def run(targets: Targets, stubs, stream: LongStream, until: float) -> None:
    request, first = body(stream.kind, stream.prompt), True
    headers: dict[str, str] = {}
    while time.time() < until:
        try:
            if stream.kind == "grpc":
                last = _call_grpc(targets.first_grpc if first else targets.grpc, request, stubs, stream)
            else:
                to = targets.url if not first else targets.pinned_url if stream.kind == "non_streaming" else targets.first_url
                last = _send(to + ROUTES[stream.kind], request, headers, stream,
                             WHOLE_ANSWER_S if stream.kind == "non_streaming" else 120.0)
        except (requests.RequestException, grpc.RpcError, ValueError) as err:
            stream.error = f"{type(err).__name__}: {str(err)[:160]}"
            return
        first = False
        if last is None:  # refused before it was accepted: the balancer sends it elsewhere next time
            if stream.kind == "non_streaming":
                stream.error = "a 503 reached the client: HAProxy did not send it again"
                return
            time.sleep(RETRY_S)
            continue
        if last.get("finish_reason") is not None:
            stream.finished, stream.resumed = True, stream.cut
            return
        resume = (last.get("error") or {}).get("resume")
        if not resume:
            stream.error = f"ended without a finish or a resume id: {json.dumps(last)[:160]}"
            return
        stream.cut = True
        request, headers = ({"resume": resume}, {}) if stream.kind in ("native", "grpc") else ({}, {"Last-Event-ID": resume})
    stream.error = stream.error or "did not finish in time"


def _send(url: str, request: dict[str, Any], headers: dict[str, str], stream: LongStream,
          wait_s: float = 120.0) -> dict | None:
    """The stream's last line or event (`finish_reason` set once it ended); None when refused with
    a 503 before anything was sent. `wait_s`: for each piece, the first included (a request queued
    behind full slots waits for one)."""
    with requests.post(url, json=request, headers=headers, stream=True, timeout=(5.0, wait_s)) as response:
        if response.status_code == 503:
            return None
        if response.status_code != 200:
            raise ValueError(f"status {response.status_code}: {response.text[:120]}")
        if stream.kind in ("native", "grpc"):
            return _read_ndjson(response.iter_lines(), stream)
        if stream.kind == "non_streaming":
            return _read_whole(response.json(), stream)
        return _read_sse(response, stream)


def _call_grpc(target: str, request: dict[str, Any], stubs, stream: LongStream,
               wait_s: float = WHOLE_ANSWER_S) -> dict | None:
    """A gRPC call's reply (the whole answer, or a resumed call's lines), read as NDJSON lines;
    None for a 503 without a resume id (refused before it was accepted)."""
    pb, pb_grpc = stubs
    with grpc.insecure_channel(target) as channel:
        reply = pb_grpc.InferenceAPIsServiceStub(channel).Predictions(
            pb.PredictionsRequest(model_name=MODEL, input={"data": json.dumps(request).encode()}), timeout=wait_s)
    return grpc_reply(reply.prediction, stream)


def grpc_reply(prediction: bytes, stream: LongStream) -> dict | None:
    """A gRPC reply's last line, its text added to the stream's; None for a 503 that names no
    resume id (a draining replica refused the call before accepting it)."""
    last = _read_ndjson(prediction.splitlines(), stream)
    error = last.get("error") or {}
    return None if error.get("code") == 503 and not error.get("resume") else last


def _read_ndjson(lines, stream: LongStream) -> dict:
    last: dict = {}
    for line in lines:
        if line:
            last = json.loads(line)
            stream.texts[0] = stream.texts.get(0, "") + last.get("text", "")
    return last


def _read_sse(response: requests.Response, stream: LongStream) -> dict:
    last: dict = {}
    for raw in response.iter_lines():
        line = raw.decode()
        if not line.startswith("data: "):
            continue
        if line == "data: [DONE]":
            return {"finish_reason": "done"}
        last = json.loads(line[6:])
        for choice in last.get("choices", []):
            delta = choice.get("delta", {})
            text = choice.get("text", delta.get("content")) or ""
            stream.texts[choice["index"]] = stream.texts.get(choice["index"], "") + text
            stream.calls += [(c["function"]["name"], c["function"]["arguments"]) for c in delta.get("tool_calls") or []]
    return last


def _read_whole(answer: dict, stream: LongStream) -> dict:
    """A non-streaming answer: its choices, or the error its chunked 200 ended with."""
    if "error" in answer:
        return answer
    for choice in answer["choices"]:
        stream.texts[choice["index"]] = choice["text"]
    return {"finish_reason": answer["choices"][0]["finish_reason"]}


def reference(url: str, count: dict[str, int]) -> dict[str, str]:
    """Each long stream's request uninterrupted, all at once, straight to one (fresh) replica."""
    streams = [LongStream(kind, prompt) for kind, prompt in kinds(count)]
    lasts: list[dict | None] = [None] * len(streams)

    def one(i: int) -> None:
        s = streams[i]
        lasts[i] = _send(url + ROUTES[s.kind], body(s.kind, s.prompt), {}, s, wait_s=REFERENCE_WAIT_S)

    threads = [threading.Thread(target=one, args=(i,), name=f"reference-{i}") for i in range(len(streams))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for last in lasts:
        assert last is not None and last.get("finish_reason") is not None, last
    return {s.prompt: s.answer for s in streams}


def summary(streams: list[LongStream], expected: dict[str, str]) -> dict[str, object]:
    """Every long stream's counts, and each kind's under `kinds`."""
    by_kind = {kind: _counts([s for s in streams if s.kind == kind], expected) for kind in dict.fromkeys(s.kind for s in streams)}
    return {**_counts(streams, expected), "tokens_each": LONG_TOKENS, "kinds": by_kind}


def _counts(streams: list[LongStream], expected: dict[str, str]) -> dict[str, object]:
    finished = [s for s in streams if s.finished]
    differs = [_first_difference(s.answer, expected[s.prompt]) for s in finished if s.answer != expected[s.prompt]]
    return {"streams": len(streams), "cut": sum(s.cut for s in streams), "resumed": sum(s.resumed for s in streams),
            "finished_uncut": sum(s.finished and not s.cut for s in streams),
            # each finished stream's joined answer against its request uncut on a fresh replica
            "fresh_replica_token_mismatch": len(differs),
            "cut_token_mismatch": sum(s.cut and s.answer != expected[s.prompt] for s in finished),
            "first_difference_at_chars": differs[:5],
            "failures": len(streams) - len(finished),
            "error_samples": sorted({s.error for s in streams if s.error})[:3]}


def _first_difference(a: str, b: str) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
