"""The resume point of a streamed event: `<key>.<point>`, one point per sample (`<key>.<p0>.<p1>`
when a request asked for n = 2).

`key` names the stream (its record, once cut): 8 hex digits of the unix time the stream began,
then 24 random hex digits (96 bits: unguessable, since a record holds someone's prompt). The
time lets a resume for a record already deleted say "expired" (410) rather than "unknown".
A sample's point is how many characters of its answer the client held after that event, one more
once its end (the finish event) was sent: a resume sends what follows. With tools the answer's
characters are the model's text, of which the client got the content the tool-call parser let out.
SSE carries the id as `id:`, NDJSON lines as `"resume"`; browsers send the last one back as
`Last-Event-ID`.

The key is a capability (whoever holds it can read the cut answer back), so it never appears in
a body's public `id`: that is `public_id(key)`, a one-way digest of it, the same on every replica
(a resumed stream keeps its id) and useless for resuming. Proxies, tracing and agent frameworks
log the public id; the key travels only in SSE `id:` lines, `Last-Event-ID` and `resume` fields.
"""
from __future__ import annotations

import hashlib
import re
import secrets
import time
from dataclasses import dataclass

KEY_PATTERN = re.compile(r"[0-9a-f]{32}")
MAX_SAMPLES = 16  # points in one id (a request's n is capped lower)
_POINT = r"(?:0|[1-9][0-9]{0,8})"
_ID_PATTERN = re.compile(rf"([0-9a-f]{{32}})((?:\.{_POINT}){{1,{MAX_SAMPLES}}})")


class ResumeIdError(ValueError):
    """Not an event id this server issues."""


@dataclass(frozen=True)
class ResumePoint:
    key: str
    points: tuple[int, ...]  # per sample: characters of its answer the client holds, +1 once it got the end

    def __str__(self) -> str:
        return event_id(self.key, self.points)


def new_key(now: float | None = None) -> str:
    began = int(time.time() if now is None else now)
    return f"{began & 0xFFFFFFFF:08x}{secrets.token_hex(12)}"


def public_id(key: str) -> str:
    """The id a stream's bodies carry: 32 hex digits that name it but cannot resume it."""
    return hashlib.sha256(b"ts-llm public id\0" + key.encode()).hexdigest()[:32]


def key_time(key: str) -> int:
    """The unix time the stream began (what new_key wrote)."""
    return int(key[:8], 16)


def event_id(key: str, points: tuple[int, ...] | list[int]) -> str:
    assert points and all(p >= 0 for p in points), points
    return key + "".join(f".{p}" for p in points)


def sample_point(chars: int, finished: bool) -> int:
    """A sample's point: the characters of its answer sent, one more once its end was."""
    return chars + finished


def parse_event_id(text: str) -> ResumePoint:
    match = _ID_PATTERN.fullmatch(text.strip())
    if match is None:
        raise ResumeIdError(f"resume id {text[:80]!r} is not an event id of this server "
                            "(32 hex digits, then a dot and a character count per sample): "
                            "send the `id` of the last event you received")
    return ResumePoint(match.group(1), tuple(int(p) for p in match.group(2)[1:].split(".")))
