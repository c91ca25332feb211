"""Phase 3's long streams: greedy NDJSON streams, each its own prompt, sent to the replica about to
get the spot notice just before it, long enough to outlive it (so that every one is cut). One that
is cut (its last line carries `error.resume`) reconnects through HAProxy with `{"resume": id}`, as
a client of resumable streams does, until it finishes; a 503 (a draining replica refused it before
accepting it) is sent again through HAProxy after the `retry:` pause. Each joined answer is compared with the same request run uncut on a
freshly started replica (`reference`), all of them at once: the engine's answers do not depend on
what else is batched with them (docs/benchmarks.md, "Batch invariance"), so neither the survivor's
batches nor the fresh replica's may change a token.

Counting: a cut stream that its client resumes to the end is not a client-visible failure (the
client reconnected, as the final event told it to); one that does not finish is.
"""
from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import requests

PROMPT = "Write a long story about a lighthouse keeper and the storm that changed everything."
LONG_TOKENS = 600  # at the chaos run's decode speed, longer than the notice's 30 s
RETRY_S = 1.0  # the SSE `retry:` the handler sends
REFERENCE_WAIT_S = 900.0  # the reference's requests beyond the fresh replica's slots wait for whole streams


def prompts(count: int) -> list[str]:
    return [f"{PROMPT} Story {i + 1}." for i in range(count)]


@dataclass
class LongStream:
    prompt: str
    text: str = ""
    cut: bool = False  # its replica cut it, and said where to resume
    resumed: bool = False  # cut, then finished after a resume
    finished: bool = False
    error: str | None = None


@dataclass
class LongStreams:
    first_url: str  # the noticed replica's .../predictions/llm
    url: str  # HAProxy's: every later request (a resume, a retry)
    count: int
    streams: list[LongStream] = field(default_factory=list)
    threads: list[threading.Thread] = field(default_factory=list)

    def start(self, until: float) -> LongStreams:
        for i, prompt in enumerate(prompts(self.count)):
            self.streams.append(stream := LongStream(prompt))
            self.threads.append(threading.Thread(target=run, args=(self.first_url, self.url, stream, until), name=f"long-{i}", daemon=True))
        for thread in self.threads:
            thread.start()
        return self

    def join(self, until: float) -> list[LongStream]:
        for thread in self.threads:
            thread.join(max(0.0, until - time.time()))
        return self.streams


def body(prompt: str) -> dict[str, object]:
    return {"prompt": prompt, "max_new_tokens": LONG_TOKENS, "stream": True, "ignore_eos": True}


def run(first_url: str, url: str, stream: LongStream, until: float) -> None:
    request, to = body(stream.prompt), first_url
    while time.time() < until:
        try:
            last = _send(to, request, stream)
        except (requests.RequestException, ValueError) as err:
            stream.error = f"{type(err).__name__}: {str(err)[:160]}"
            return
        to = url
        if last is None:  # refused before it was accepted: the balancer sends it elsewhere next time
            time.sleep(RETRY_S)
            continue
        if last.get("finish_reason") is not None:
            stream.finished, stream.resumed = True, stream.cut
            return
        resume = (last.get("error") or {}).get("resume")
        if not resume:
            stream.error = f"ended without a finish or a resume id: {json.dumps(last)[:160]}"
            return
        stream.cut, request = True, {"resume": resume}
    stream.error = stream.error or "did not finish in time"


def _send(url: str, request: dict[str, Any], stream: LongStream, wait_s: float = 120.0) -> dict | None:
    """The stream's last line; None when refused with a 503 before anything was sent. `wait_s`:
    for each piece, the first included (a request queued behind full slots waits for one)."""
    with requests.post(url, json=request, stream=True, timeout=(5.0, wait_s)) as response:
        if response.status_code == 503:
            return None
        if response.status_code != 200:
            raise ValueError(f"status {response.status_code}: {response.text[:120]}")
        last: dict = {}
        for line in response.iter_lines():
            if line:
                last = json.loads(line)
                stream.text += last.get("text", "")
        return last


def reference(url: str, count: int) -> dict[str, str]:
    """Each long stream's request uninterrupted, all at once, straight to one (fresh) replica."""
    streams = [LongStream(prompt) for prompt in prompts(count)]
    lasts: list[dict | None] = [None] * count

    def one(i: int) -> None:
        lasts[i] = _send(url, body(streams[i].prompt), streams[i], wait_s=REFERENCE_WAIT_S)

    threads = [threading.Thread(target=one, args=(i,), name=f"reference-{i}") for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for last in lasts:
        assert last is not None and last.get("finish_reason") == "length", last
    return {s.prompt: s.text for s in streams}


def summary(streams: list[LongStream], expected: dict[str, str]) -> dict[str, object]:
    finished = [s for s in streams if s.finished]
    differs = [_first_difference(s.text, expected[s.prompt]) for s in finished if s.text != expected[s.prompt]]
    return {"streams": len(streams), "tokens_each": LONG_TOKENS,
            "cut": sum(s.cut for s in streams), "resumed": sum(s.resumed for s in streams),
            "finished_uncut": sum(s.finished and not s.cut for s in streams),
            # Greedy: each finished stream's joined text against its request uncut on a fresh replica.
            "fresh_replica_token_mismatch": len(differs),
            "cut_token_mismatch": sum(s.cut and s.text != expected[s.prompt] for s in finished),
            "first_difference_at_chars": differs[:5],
            "failed": len(streams) - len(finished),
            "error_samples": sorted({s.error for s in streams if s.error})[:3]}


def _first_difference(a: str, b: str) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
