"""The soak run's requests (bench/load.py's ClosedLoop sends them): each is one of five kinds,
and its outcome is judged from the client's side only.

    stream      native API, streamed: 200 and a last NDJSON line with a finish_reason
    whole       native API, one JSON body with a finish_reason
    chat        OpenAI chat completions, streamed: 200 and `data: [DONE]` after a finish_reason
    malformed   a request that must be refused with a 4xx that says why (never a 5xx)
    disconnect  streamed; the client reads a few chunks and closes the connection

An outcome is `ok`, `server_error` (a 5xx, a reset, a timeout, or an answer that ended without
its finish on a request the client did not cut) or `not_refused` (a malformed request that was
not answered 4xx).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

import requests

from bench.load import PROMPTS, Record, Send, finished

KINDS = {"stream": 0.3, "whole": 0.25, "chat": 0.2, "malformed": 0.15, "disconnect": 0.1}
# (what is wrong, route, raw body): each must get a 4xx.
MALFORMED = (
    ("not JSON", "", b"{prompt: hi"),
    ("negative max_new_tokens", "", json.dumps({"prompt": "hi", "max_new_tokens": -3}).encode()),
    ("no prompt", "", json.dumps({"max_new_tokens": 4}).encode()),
    ("temperature not a number", "", json.dumps({"prompt": "hi", "temperature": "hot"}).encode()),
    ("prompt longer than the context", "", json.dumps({"prompt": "word " * 3000}).encode()),
    ("messages not a list", "/1.0/v1/chat/completions", json.dumps({"messages": "hello"}).encode()),
)


@dataclass(frozen=True)
class Api:
    url: str  # .../predictions/llm
    headers: dict[str, str]  # the inference token
    timeout_s: float = 120.0


def sender(api: Api) -> Send:
    """A kind drawn by KINDS' weights; the outcome is ok, server_error or not_refused, and the
    record's error says what went wrong (for a malformed request: its fault, refused or not)."""

    def send(record: Record, rng: random.Random) -> float:
        record.kind = rng.choices(list(KINDS), weights=list(KINDS.values()))[0]
        try:
            record.status, record.outcome, record.error = SENDERS[record.kind](api, rng)
        except requests.RequestException as err:
            record.outcome, record.error = "server_error", f"{type(err).__name__}: {str(err)[:160]}"
        return 0.0

    return send


def _native(api: Api, rng: random.Random, stream: bool) -> tuple[int, str, str]:
    body: dict[str, Any] = {"prompt": rng.choice(PROMPTS), "max_new_tokens": rng.randint(4, 48), "stream": stream}
    with requests.post(api.url, json=body, headers=api.headers, stream=True, timeout=(5, api.timeout_s)) as r:
        payload = r.content
    if r.status_code != 200:
        return r.status_code, "server_error", payload[:160].decode(errors="replace")
    if finished(payload, stream):
        return 200, "ok", ""
    return 200, "server_error", f"no finish_reason: {payload[-160:]!r}"


def _stream(api: Api, rng: random.Random) -> tuple[int, str, str]:
    return _native(api, rng, stream=True)


def _whole(api: Api, rng: random.Random) -> tuple[int, str, str]:
    return _native(api, rng, stream=False)


def _chat(api: Api, rng: random.Random) -> tuple[int, str, str]:
    body: dict[str, Any] = {"messages": [{"role": "user", "content": rng.choice(PROMPTS)}],
            "max_tokens": rng.randint(4, 48), "stream": True}
    with requests.post(api.url + "/1.0/v1/chat/completions", json=body, headers=api.headers, stream=True,
                       timeout=(5, api.timeout_s)) as r:
        payload = r.content.decode(errors="replace")
    if r.status_code != 200:
        return r.status_code, "server_error", payload[:160]
    events = [line[5:].strip() for line in payload.splitlines() if line.startswith("data:")]
    finished = len(events) >= 2 and events[-1] == "[DONE]" and any(
        c.get("finish_reason") for c in json.loads(events[-2]).get("choices") or [])
    return 200, "ok" if finished else "server_error", "" if finished else f"no finish: {payload[-160:]!r}"


def _malformed(api: Api, rng: random.Random) -> tuple[int, str, str]:
    what, route, raw = rng.choice(MALFORMED)
    r = requests.post(api.url + route, data=raw, headers={**api.headers, "Content-Type": "application/json"},
                      timeout=(5, api.timeout_s))
    if 400 <= r.status_code < 500:
        return r.status_code, "ok", what
    outcome = "server_error" if r.status_code >= 500 else "not_refused"
    return r.status_code, outcome, f"{what}: {r.text[:120]}"


def _disconnect(api: Api, rng: random.Random) -> tuple[int, str, str]:
    body: dict[str, Any] = {"prompt": rng.choice(PROMPTS), "max_new_tokens": 64, "stream": True}
    r = requests.post(api.url, json=body, headers=api.headers, stream=True, timeout=(5, api.timeout_s))
    try:
        if r.status_code != 200:
            return r.status_code, "server_error", r.text[:160]
        lines = r.iter_lines()
        for _ in range(rng.randint(1, 4)):
            next(lines, None)
    finally:
        r.close()  # goes away mid-answer: the server must free what the request held
    return 200, "ok", ""


SENDERS = {"stream": _stream, "whole": _whole, "chat": _chat, "malformed": _malformed,
           "disconnect": _disconnect}
