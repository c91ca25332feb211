"""One generation in the engine (a Sequence: a request's sample in its slot) and what a step
reports for it (StepOutput)."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from handler.engine.grammar import Matcher
from handler.engine.sampling import SamplingParams, TokenLogprob


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
    started: bool = False  # its prefill has begun (its slot's cached prefix is settled)
    prefilled: int = 0  # prompt positions with KV in its slot
    decoding: bool = False  # prefilled up to its prompt's last token, which decode takes
    cached_tokens: int = 0  # of those, taken from the prefix cache rather than computed
    output_ids: list[int] = field(default_factory=list)
    text: str = ""
    emitted_chars: int = 0
    finish_reason: str | None = None

    @property
    def prefill_end(self) -> int:
        return len(self.prompt_ids) - 1  # the last token is decoded

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
