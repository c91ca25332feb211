"""Retries for transient HTTP failures: exponential backoff with full jitter.

Only timeouts, refused connections, 429 and 5xx are retried; a 403 or a malformed body is
not going to fix itself and is raised at once.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import requests

from handler.sidecar.errors import MetadataUnavailable, TransientError

T = TypeVar("T")
Sleep = Callable[[float], None]


@dataclass(frozen=True)
class Backoff:
    attempts: int = 4  # total tries, the first included
    base_s: float = 0.2
    cap_s: float = 2.0

    def delay(self, attempt: int, rng: random.Random) -> float:
        """Full jitter: uniform in [0, min(cap, base * 2**attempt)], so many sidecars that
        saw the same IMDS hiccup do not retry in lockstep."""
        return rng.uniform(0.0, min(self.cap_s, self.base_s * (2 ** attempt)))


DEFAULT_BACKOFF = Backoff()


def call_with_retry(fn: Callable[[], T], backoff: Backoff, rng: random.Random,
                    sleep: Sleep, what: str) -> T:
    last: TransientError | None = None
    for attempt in range(backoff.attempts):
        try:
            return fn()
        except TransientError as err:
            last = err
            if attempt + 1 < backoff.attempts:
                sleep(backoff.delay(attempt, rng))
    raise MetadataUnavailable(f"{what}: gave up after {backoff.attempts} tries: {last}") from last


def send(session: requests.Session, method: str, url: str, *, timeout_s: float,
         headers: Mapping[str, str] | None = None, params: Mapping[str, str] | None = None,
         json_body: Any = None) -> requests.Response:
    """One HTTP exchange; failures worth repeating come back as TransientError."""
    try:
        response = session.request(method, url, headers=dict(headers or {}), params=params,
                                   json=json_body, timeout=timeout_s)
    except (requests.Timeout, requests.ConnectionError) as err:
        raise TransientError(f"{method} {url}: {type(err).__name__}") from err
    if response.status_code == 429 or response.status_code >= 500:
        raise TransientError(f"{method} {url}: HTTP {response.status_code}")
    return response
