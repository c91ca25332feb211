"""Closed-loop load for the chaos run: N client threads, every request recorded.

A request's outcome, from the client's side only:

    completed          200 and the whole answer (a final NDJSON line / a JSON body with a
                       finish_reason)
    refused_503        503 before any 200: refused before it was accepted (retryable)
    refused_connect    connection refused: nothing listening (retryable)
    failed_status      any other status (accepted or not, the client cannot tell: counted lost)
    cut_off            200, then the answer broke off or ended without a finish_reason
    unanswered         connected, sent, and no status came back (timeout, reset)

`lost` = failed_status + cut_off + unanswered: accepted (or possibly accepted) and not served.
"""

from __future__ import annotations

import errno
import json
import random
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import requests

REFUSED = ("refused_503", "refused_connect")
LOST = ("failed_status", "cut_off", "unanswered")
PROMPTS = ("Tell me about lighthouses.", "Write a haiku about the sea.",
           "Explain what a spot instance is.", "List three colours.",
           "Describe a cat in one sentence.", "What is continuous batching?")


@dataclass
class Record:
    client: int
    stream: bool
    max_new_tokens: int
    start: float
    status_at: float | None = None  # when the status line arrived
    end: float = 0.0
    status: int | None = None
    outcome: str = ""
    error: str = ""

    @property
    def accepted(self) -> bool:
        return self.status == 200


@dataclass(frozen=True)
class Target:
    url: str  # .../predictions/llm
    headers: Callable[[], dict[str, str]]  # the inference token can change with a restart


class Load:
    def __init__(self, target: Target, clients: int, seed: int = 0,
                 tokens: tuple[int, int] = (4, 16), read_timeout_s: float = 90.0) -> None:
        self.target = target
        self.clients = clients
        self.tokens = tokens
        self.read_timeout_s = read_timeout_s
        self.records: list[Record] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._rng = random.Random(seed)
        self._threads = [threading.Thread(target=self._client, args=(i,), name=f"client-{i}",
                                          daemon=True) for i in range(clients)]

    def start(self) -> Load:
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
            record = Record(index, stream=rng.random() < 0.5,
                            max_new_tokens=rng.randint(*self.tokens), start=time.time())
            with self._lock:
                self.records.append(record)
            send(self.target, record, rng.choice(PROMPTS), self.read_timeout_s)
            # A refused request is retried (here: against the same replica, after a pause,
            # as a client behind a load balancer would land on another one).
            pause = 0.5 if record.outcome in REFUSED else rng.uniform(0.0, 0.2)
            self._stop.wait(pause)


def send(target: Target, record: Record, prompt: str, read_timeout_s: float) -> None:
    body = {"prompt": prompt, "max_new_tokens": record.max_new_tokens, "stream": record.stream,
            "ignore_eos": True}
    try:
        with requests.post(target.url, json=body, headers=target.headers(), stream=True,
                           timeout=(5.0, read_timeout_s)) as response:
            record.status, record.status_at = response.status_code, time.time()
            payload = response.content  # reads to the end (chunked or not)
        record.outcome = _classify(record, payload)
    except requests.RequestException as err:
        record.error = f"{type(err).__name__}: {str(err)[:160]}"
        record.outcome = _classify_error(record, err)
    finally:
        record.end = time.time()


def _classify(record: Record, payload: bytes) -> str:
    if record.status == 503:
        return "refused_503"
    if record.status != 200:
        record.error = payload[:160].decode(errors="replace")
        return "failed_status"
    return "completed" if _finished(payload, record.stream) else "cut_off"


def _classify_error(record: Record, err: requests.RequestException) -> str:
    if record.status == 200:
        return "cut_off"  # the status came, the answer did not
    if record.status is not None:
        return "refused_503" if record.status == 503 else "failed_status"
    return "refused_connect" if _connection_refused(err) else "unanswered"


def _finished(payload: bytes, stream: bool) -> bool:
    try:
        if stream:
            lines = [line for line in payload.decode().splitlines() if line.strip()]
            return bool(lines) and json.loads(lines[-1]).get("finish_reason") is not None
        return json.loads(payload).get("finish_reason") is not None
    except (ValueError, AttributeError):
        return False


def _connection_refused(err: BaseException) -> bool:
    """ECONNREFUSED anywhere in the chain (requests wraps urllib3 wraps the socket error)."""
    seen: set[int] = set()
    stack: list[object] = [err]
    while stack:
        item = stack.pop()
        if not isinstance(item, BaseException) or id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, ConnectionRefusedError) or getattr(item, "errno", None) == \
                errno.ECONNREFUSED:
            return True
        stack.extend([item.__cause__, item.__context__, *item.args,
                      getattr(item, "reason", None)])
    return "Connection refused" in str(err)


def outcome_counts(records: list[Record]) -> dict[str, int]:
    counts = dict.fromkeys(("completed", *REFUSED, *LOST), 0)
    for record in records:
        counts[record.outcome] = counts.get(record.outcome, 0) + 1
    return counts


def as_rows(records: list[Record]) -> list[dict[str, object]]:
    return [asdict(record) for record in records]
