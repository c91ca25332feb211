"""The chaos run's requests (bench/load.py's ClosedLoop sends them) and their outcomes, judged
from the client's side only:

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
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import requests

from bench.load import PROMPTS, Record, Send, finished

REFUSED = ("refused_503", "refused_connect")
LOST = ("failed_status", "cut_off", "unanswered")


@dataclass(frozen=True)
class Target:
    url: str  # .../predictions/llm
    headers: Callable[[], dict[str, str]]  # the inference token can change with a restart


def sender(target: Target, tokens: tuple[int, int], read_timeout_s: float = 90.0) -> Send:
    """Half streamed, half whole, `tokens` (min, max) new tokens each, every one to the end."""

    def send(record: Record, rng: random.Random) -> float:
        record.kind = "stream" if rng.random() < 0.5 else "whole"
        record.max_new_tokens = rng.randint(*tokens)
        post(target, record, rng.choice(PROMPTS), read_timeout_s)
        # A refused request is retried (here: against the same replica, after a pause,
        # as a client behind a load balancer would land on another one).
        return 0.5 if record.outcome in REFUSED else rng.uniform(0.0, 0.2)

    return send


def post(target: Target, record: Record, prompt: str, read_timeout_s: float) -> None:
    body = {"prompt": prompt, "max_new_tokens": record.max_new_tokens, "stream": record.kind == "stream",
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


def _classify(record: Record, payload: bytes) -> str:
    if record.status == 503:
        return "refused_503"
    if record.status != 200:
        record.error = payload[:160].decode(errors="replace")
        return "failed_status"
    return "completed" if finished(payload, record.kind == "stream") else "cut_off"


def _classify_error(record: Record, err: requests.RequestException) -> str:
    if record.status == 200:
        return "cut_off"  # the status came, the answer did not
    if record.status is not None:
        return "refused_503" if record.status == 503 else "failed_status"
    return "refused_connect" if _connection_refused(err) else "unanswered"


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
