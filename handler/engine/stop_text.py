"""Which of a sequence's decoded text may be sent: stop strings cut it, and text that could
still become a stop string or an incomplete UTF-8 character is held back until it is settled."""
from __future__ import annotations

from typing import Protocol

from handler.engine.sampling import SamplingParams


class Sequence(Protocol):
    """What these read and write of the engine's Sequence."""
    params: SamplingParams
    text: str  # all decoded text (cut at a stop string)
    emitted_chars: int  # how much of it was sent
    finish_reason: str | None


def cut_at_stop(seq: Sequence) -> bool:
    # Only the tail can hold a new match: search from just before the text emitted so far.
    for stop in seq.params.stop:
        at = seq.text.find(stop, max(0, seq.emitted_chars - len(stop)))
        if at != -1:
            seq.text = seq.text[:at]
            return True
    return False


def take_text(seq: Sequence) -> str:
    """Text safe to emit now: all of it once finished; else hold back an incomplete UTF-8
    character and any tail that could still grow into a stop string."""
    end = len(seq.text)
    if seq.finish_reason is None:
        if seq.text.endswith("\ufffd"):
            end -= 1
        end -= _stop_prefix_len(seq.text[:end], seq.params.stop)
    end = max(end, seq.emitted_chars)
    delta = seq.text[seq.emitted_chars : end]
    seq.emitted_chars = end
    return delta


def _stop_prefix_len(text: str, stops: tuple[str, ...]) -> int:
    longest = 0
    for stop in stops:
        for k in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:k]):
                longest = k
                break
    return longest
