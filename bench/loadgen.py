"""A closed-loop load generator: N clients, each sending its share of a fixed request count.

Every request is recorded (start, first content, each later chunk, end, status, tokens), so the
summary is computed from raw per-request data that is also written out.
"""
from __future__ import annotations

import json
import threading
import time
from dataclasses import asdict, dataclass, field

import requests


@dataclass
class Record:
    client: int
    start: float
    status: int = 0
    first: float | None = None  # first non-empty content
    chunks: list[float] = field(default_factory=list)
    end: float | None = None
    completion_tokens: int = 0
    error: str | None = None


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


def summarize(records: list[Record]) -> dict:
    ok = [r for r in records if r.status == 200 and r.error is None]
    duration = max(r.end for r in records) - min(r.start for r in records)
    ttft = [r.first - r.start for r in ok if r.first]
    itl = [b - a for r in ok for a, b in zip(r.chunks, r.chunks[1:])]
    e2e = [r.end - r.start for r in ok]
    tokens = sum(r.completion_tokens for r in ok)
    out = {"requests": len(records), "errors": len(records) - len(ok), "duration_s": duration, "output_tokens": tokens,
           "request_throughput": len(ok) / duration, "output_tokens_per_s": tokens / duration}
    for name, vals in (("ttft", ttft), ("itl", itl), ("e2e", e2e)):
        out[f"{name}_p50_s"] = percentile(vals, 0.5)
        out[f"{name}_p99_s"] = percentile(vals, 0.99)
    return out


def raw(records: list[Record]) -> list[dict]:
    return [asdict(r) for r in records]
