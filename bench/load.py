"""The benchmarks' load client: closed-loop clients over HTTP, every request kept as a Record
of what its client saw, and one prompt set.

Two ways to drive it:

    run_load    a fixed list of request bodies shared by N clients, each sending its next as soon
                as its last ended (the sweeps of peer, serve, modes and startup); times on
                perf_counter; summarize() reads throughput and latency from the records
    ClosedLoop  N clients sending until stopped, each request made and judged by a `send`
                function (the chaos run's outcomes, the soak run's kinds); times are epoch
                seconds, to line up with the sidecar's and the emulator's
"""
from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import requests

PROMPTS = (
    "Write a short story about a robot who learns to paint.",
    "Explain how a bicycle stays upright while moving.",
    "List some tips for keeping houseplants healthy.",
    "What are the main differences between a lake and a sea?",
    "Describe the water cycle to a ten-year-old.",
    "Give me a recipe idea that uses rice, eggs and spinach.",
    "Why do cats purr? Answer in a few sentences.",
    "Summarize the plot of a mystery novel set on a train.",
)


@dataclass
class Record:
    """One request as its client saw it; times on its runner's clock."""

    client: int
    start: float
    kind: str = ""  # what was sent: stream or whole (native API), chat, malformed, disconnect
    max_new_tokens: int | None = None
    status: int | None = None  # None: no status came back
    status_at: float | None = None  # when the status line arrived
    first: float | None = None  # first non-empty content
    chunks: list[float] = field(default_factory=list)  # when each content chunk arrived
    end: float = 0.0  # 0.0 while in flight
    completion_tokens: int = 0  # the server's usage count
    prompt_tokens: int = 0  # ... and of the prompt
    outcome: str = ""  # the run's verdict (ClosedLoop's send)
    error: str | None = None  # what went wrong; a malformed request's fault

    @property
    def accepted(self) -> bool:
        return self.status == 200


# ---- a fixed number of requests

def run_load(url: str, headers: dict, bodies: list[dict], concurrency: int, stream: bool, timeout: float = 600) -> list[Record]:
    records: list[Record] = []
    lock = threading.Lock()
    queue = list(enumerate(bodies))

    def client(cid: int) -> None:
        with requests.Session() as session:
            while True:
                with lock:
                    if not queue:
                        return
                    _, body = queue.pop(0)
                rec = _one(session, url, headers, {**body, **({"stream": True} if stream else {})}, stream, timeout, cid)
                with lock:
                    records.append(rec)

    threads = [threading.Thread(target=client, args=(c,), daemon=True) for c in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return records


def _one(session, url, headers, body, stream, timeout, cid) -> Record:
    rec = Record(cid, time.perf_counter())
    try:
        with session.post(url, json=body, headers=headers, stream=True, timeout=timeout) as r:
            rec.status = r.status_code
            usage = None
            for line in r.iter_lines():
                if not line or line.startswith(b":"):  # an SSE comment (keep-alive)
                    continue
                now = time.perf_counter()
                event, content = _event(line)
                if event is None:
                    continue
                usage = event.get("usage") or usage
                if content:
                    rec.first = rec.first or now
                    rec.chunks.append(now)
            rec.end = time.perf_counter()
            if r.status_code == 200 and usage is not None:
                rec.completion_tokens = usage.get("completion_tokens", 0)
                rec.prompt_tokens = usage.get("prompt_tokens", 0)
    except (requests.RequestException, ValueError) as err:
        rec.error = f"{type(err).__name__}: {err}"
        rec.end = time.perf_counter()
    return rec


def _event(line: bytes) -> tuple[dict | None, bool]:
    """(the JSON object, whether it carries content) of one line: NDJSON (native API: every line
    counts) or an OpenAI server-sent event (content: a choice with text; [DONE] is no event)."""
    if not line.startswith(b"data:"):
        return json.loads(line), True
    payload = line[5:].strip()
    if payload == b"[DONE]":
        return None, False
    event = json.loads(payload)
    texts = [c.get("text") or (c.get("delta") or {}).get("content") for c in event.get("choices") or []]
    return event, any(texts)


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    k = (len(s) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def summarize(records: list[Record], duration: float | None = None) -> dict:
    """`duration`: the seconds the load took (default: first start to last end; give it when
    `records` pool loads run apart, as the sum of their own)."""
    ok = [r for r in records if r.status == 200 and r.error is None]
    seconds = duration or span(records)
    ttft = [r.first - r.start for r in ok if r.first]
    itl = [b - a for r in ok for a, b in zip(r.chunks, r.chunks[1:])]
    e2e = [r.end - r.start for r in ok]
    tokens = sum(r.completion_tokens for r in ok)
    out: dict[str, float | None] = {
        "requests": len(records), "errors": len(records) - len(ok), "duration_s": seconds, "output_tokens": tokens,
        "request_throughput": len(ok) / seconds, "output_tokens_per_s": tokens / seconds}
    for name, vals in (("ttft", ttft), ("itl", itl), ("e2e", e2e)):
        out[f"{name}_p50_s"] = percentile(vals, 0.5)
        out[f"{name}_p99_s"] = percentile(vals, 0.99)
    return out


def span(records: list[Record]) -> float:
    """Seconds from the first request's start to the last one's end."""
    return max(r.end for r in records) - min(r.start for r in records)


def as_rows(records: list[Record]) -> list[dict]:
    return [asdict(r) for r in records]


# ---- clients sending until stopped

Send = Callable[[Record, random.Random], float]  # fills the record; returns the pause before the next


class ClosedLoop:
    def __init__(self, clients: int, send: Send, seed: int = 0) -> None:
        self.send = send
        self.records: list[Record] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._rng = random.Random(seed)
        self._threads = [threading.Thread(target=self._client, args=(i,), name=f"client-{i}",
                                          daemon=True) for i in range(clients)]

    def start(self) -> ClosedLoop:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self, timeout_s: float = 120.0) -> None:
        """No new requests; wait for the ones in progress (each bounded by its timeouts)."""
        self._stop.set()
        give_up = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(timeout=max(give_up - time.monotonic(), 0.1))

    def snapshot(self) -> list[Record]:
        with self._lock:
            return list(self.records)

    def _client(self, index: int) -> None:
        with self._lock:
            rng = random.Random(self._rng.random())
        while not self._stop.is_set():
            record = Record(index, start=time.time())
            with self._lock:
                self.records.append(record)
            try:
                pause = self.send(record, rng)
            finally:
                record.end = time.time()
            self._stop.wait(pause)


def finished(payload: bytes, stream: bool) -> bool:
    """Whether a native-API answer ended whole: its last NDJSON line (streamed) or its body
    carries a finish_reason."""
    try:
        if stream:
            lines = [line for line in payload.decode().splitlines() if line.strip()]
            return bool(lines) and json.loads(lines[-1]).get("finish_reason") is not None
        return json.loads(payload).get("finish_reason") is not None
    except (ValueError, AttributeError):
        return False
