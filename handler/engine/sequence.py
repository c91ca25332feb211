"""One generation in the engine (a Sequence: a request's sample in its slot), what a step
reports for it (StepOutput), and which of its decoded text may be sent: stop strings cut it, and
text that could still become a stop string or an incomplete UTF-8 character is held back until
it is settled."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from handler.engine.grammar import Matcher
from handler.engine.sampling import LogitControls, SamplingParams, TokenLogprob


@dataclass(frozen=True)
class Continuation:
    """Where a generation cut on another replica goes on: the tokens it had generated, how many
    characters of their text its client holds (what follows is sent), its sampling generator's
    state after them (None: greedy), and which of its request's samples it is."""
    output_ids: tuple[int, ...]
    sent_chars: int
    rng_state: bytes | None = None
    index: int = 0


@dataclass
class Sequence:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    slot: int
    generator: torch.Generator | None
    index: int = 0  # which of its request's samples
    leader: Sequence | None = None  # the request's first sample, whose prefill this one copies
    matcher: Matcher | None = None  # its grammar's state, when params.json_schema constrains it
    controls: LogitControls | None = None  # its penalties, bias and min_tokens, when params ask for any
    started: bool = False  # its prefill has begun (its slot's cached prefix is settled)
    prefilled: int = 0  # prompt positions with KV in its slot
    decoding: bool = False  # prefilled up to its prompt's last token, which decode takes
    cached_tokens: int = 0  # of those, taken from the prefix cache rather than computed
    output_ids: list[int] = field(default_factory=list)
    text: str = ""  # all decoded text (cut at a stop string)
    emitted_chars: int = 0  # how much of it was sent
    finish_reason: str | None = None

    @property
    def context(self) -> list[int]:
        """What is prefilled: the prompt, then a resumed generation's tokens from before its cut."""
        return self.prompt_ids + self.output_ids if self.output_ids else self.prompt_ids

    @property
    def prefill_end(self) -> int:
        return len(self.context) - 1  # the last token is decoded

    @property
    def last_token(self) -> int:
        # the token the next decode step feeds: the prompt's last, then the last sampled
        return self.output_ids[-1] if self.output_ids else self.prompt_ids[-1]

    @property
    def next_pos(self) -> int:
        # position of last_token, which the next decode step writes into the cache
        return len(self.prompt_ids) + len(self.output_ids) - 1


@dataclass(frozen=True)
class StepOutput:
    request_id: str
    index: int  # which of the request's samples (0 unless it asked for several)
    text: str  # new text since the previous output of this request
    token_ids: tuple[int, ...]
    finish_reason: str | None  # None while running; "stop" or "length" when done
    prompt_tokens: int
    completion_tokens: int
    logprobs: tuple[TokenLogprob, ...] = ()  # of token_ids, when the request asked for them
    cached_tokens: int = 0  # prompt tokens whose KV came from the prefix cache

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


# ---- a generation cut on one replica, resumed on another -----------------------------------

def continuation(seq: Sequence) -> Continuation:
    state = None if seq.generator is None else seq.generator.get_state().numpy().tobytes()
    return Continuation(tuple(seq.output_ids), seq.emitted_chars, state, seq.index)


def restore(seq: Sequence, at: Continuation, decode: Callable[[list[int]], str]) -> None:
    """A new sequence as `at` left it: its tokens (prefilled after the prompt: `context`), the
    logit controls' and grammar's state they led to, its generator's state, and its text, of
    which what the client holds is not sent again."""
    for token in at.output_ids:
        if seq.controls is not None:
            seq.controls.accept(token)
        if seq.matcher is not None:
            seq.matcher.accept(token)
    seq.output_ids = list(at.output_ids)
    seq.text = decode(seq.output_ids)
    seq.emitted_chars = min(at.sent_chars, len(seq.text))
    if seq.generator is not None and at.rng_state is not None:
        seq.generator.set_state(torch.frombuffer(bytearray(at.rng_state), dtype=torch.uint8))


# ---- the text a sequence may send -------------------------------------------------------------

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
        end -= stop_prefix_len(seq.text[:end], seq.params.stop)
    end = max(end, seq.emitted_chars)
    delta = seq.text[seq.emitted_chars : end]
    seq.emitted_chars = end
    return delta


def stop_prefix_len(text: str, stops: tuple[str, ...]) -> int:
    """How many characters at the end of text could still grow into one of stops."""
    longest = 0
    for stop in stops:
        for k in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:k]):
                longest = k
                break
    return longest
