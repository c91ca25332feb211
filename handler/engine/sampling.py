"""Per-request sampling: greedy, temperature, top-k, top-p, each request with its own seed; the
log-probabilities of sampled tokens for requests that ask for them; and the logit controls
(LogitControls: logit_bias, min_tokens, repetition_penalty, presence_penalty, frequency_penalty, as
OpenAI and vLLM define them) applied to a sequence's row of logits after the compiled step. Each
row keeps its own dense [V] state, so one request's controls never touch another's row and a step
costs a few vector ops per row, whatever the length."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

MAX_TOP_LOGPROBS = 20


@dataclass(frozen=True)
class TokenLogprob:
    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...]  # the k most likely (token id, logprob), most likely first


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int = 128
    temperature: float = 0.0  # 0 means greedy
    top_k: int = 0  # 0 means no top-k cut
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False  # benchmarks: always generate max_new_tokens (end-of-sequence tokens are never sampled)
    logprobs: int | None = None  # None: none; k: each token's log-probability and the k most likely
    json_schema: str | None = None  # output constrained to this JSON schema (grammar.schema_text)
    # Logit controls (LogitControls below), as OpenAI and vLLM define them:
    frequency_penalty: float = 0.0  # minus this times each token's count in the output so far
    presence_penalty: float = 0.0  # minus this for each token the output holds
    repetition_penalty: float = 1.0  # tokens of the prompt or output: positive logits / it, negative * it
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, added to its logit)
    min_tokens: int = 0  # end-of-sequence and stop_token_ids are not sampled before this many tokens
    stop_token_ids: tuple[int, ...] = ()  # sampling one ends the sequence ("stop"), as end-of-sequence does

    def __post_init__(self):
        assert self.max_new_tokens >= 1, self.max_new_tokens
        assert self.temperature >= 0.0, self.temperature
        assert self.top_k >= 0, self.top_k
        assert 0.0 < self.top_p <= 1.0, self.top_p
        assert self.logprobs is None or 0 <= self.logprobs <= MAX_TOP_LOGPROBS, self.logprobs
        assert self.repetition_penalty > 0.0 and 0 <= self.min_tokens <= self.max_new_tokens, self

    @property
    def controls_logits(self) -> bool:
        return bool(self.frequency_penalty or self.presence_penalty or self.repetition_penalty != 1.0
                    or self.logit_bias or self.min_tokens)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1


def make_generator(params: SamplingParams) -> torch.Generator | None:
    if params.greedy:
        return None
    gen = torch.Generator()
    if params.seed is None:
        gen.seed()
    else:
        gen.manual_seed(params.seed)
    return gen


def sample_next(logits: Tensor, params: list[SamplingParams], generators: list[torch.Generator | None]) -> list[int]:
    """logits: [B, V] float32 on any device; returns one token id per row."""
    greedy_ids = logits.argmax(dim=-1).tolist()
    out = []
    for row, (p, gen) in enumerate(zip(params, generators)):
        out.append(greedy_ids[row] if p.greedy else _sample_row(logits[row].float().cpu(), p, gen))
    return out


def _sample_row(logits: Tensor, p: SamplingParams, gen: torch.Generator | None) -> int:
    # logits: [V] on CPU, so the seeded CPU generator makes a request reproducible on any device.
    logits = logits / p.temperature
    if p.top_k:
        kth = torch.topk(logits, min(p.top_k, logits.numel())).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if p.top_p < 1.0:
        probs = _top_p_filter(probs, p.top_p)
    return int(torch.multinomial(probs, 1, generator=gen))


def _top_p_filter(probs: Tensor, top_p: float) -> Tensor:
    sorted_probs, order = probs.sort(descending=True)
    # Keep the smallest prefix whose mass reaches top_p (always at least the top token).
    drop = sorted_probs.cumsum(-1) - sorted_probs >= top_p
    sorted_probs = sorted_probs.masked_fill(drop, 0.0)
    return torch.zeros_like(probs).scatter(0, order, sorted_probs)


def token_logprob(logits: Tensor, token_id: int, p: SamplingParams) -> TokenLogprob:
    """logits: [V]. Log-probabilities of the distribution after temperature (greedy: the logits as
    they are), before top-k / top-p cut it: what the client's temperature makes of the model."""
    scaled = logits.float().cpu() / (p.temperature if p.temperature > 0 else 1.0)
    logprobs = torch.log_softmax(scaled, dim=-1)
    values, ids = torch.topk(logprobs, p.logprobs or 0)
    # A grammar may allow fewer than k tokens: the rest are -inf, which JSON cannot carry.
    top = tuple((i, v) for i, v in zip(ids.tolist(), values.tolist()) if v != float("-inf"))
    return TokenLogprob(token_id, float(logprobs[token_id]), top)


class LogitControls:
    def __init__(self, params: SamplingParams, prompt_ids: list[int], end_ids: frozenset[int]):
        self.params = params
        self._prompt_ids = prompt_ids
        self._end_ids = sorted(end_ids | set(params.stop_token_ids))  # held back until min_tokens
        self._generated = 0
        self._in_output: set[int] = set()
        # [V] float32: logit_bias minus the frequency and presence penalties so far, kept up to
        # date as tokens are accepted, so that applying them is one add per step.
        self._offset: Tensor | None = None
        self._seen: Tensor | None = None  # [V] bool, tokens of the prompt or the output (repetition)
        self._early: list[int] = []  # accepted before the [V] state existed (handler.engine.sequence.restore)

    @classmethod
    def for_params(cls, params: SamplingParams, prompt_ids: list[int], end_ids: frozenset[int]) -> LogitControls | None:
        return cls(params, prompt_ids, end_ids) if params.controls_logits else None

    def apply(self, logits: Tensor) -> None:
        """logits: [V] float32, in place."""
        p = self.params
        if self._offset is None:
            self._allocate(logits.shape[-1], logits.device)
        assert self._offset is not None
        if self._generated < p.min_tokens:
            logits[self._end_ids] = float("-inf")
        if self._seen is not None:  # before the offset: repetition scales the model's own logits
            penalized = torch.where(logits > 0, logits / p.repetition_penalty, logits * p.repetition_penalty)
            logits.copy_(torch.where(self._seen, penalized, logits))
        logits.add_(self._offset)

    def accept(self, token: int) -> None:
        self._generated += 1
        if self._offset is None:  # a resumed generation's tokens, before its first step allocates
            self._early.append(token)
            return
        self._count(token)

    def _count(self, token: int) -> None:
        assert self._offset is not None
        p = self.params
        self._offset[token] -= p.frequency_penalty + (p.presence_penalty if token not in self._in_output else 0.0)
        self._in_output.add(token)
        if self._seen is not None:
            self._seen[token] = True

    def _allocate(self, vocab: int, device: torch.device) -> None:
        self._offset = torch.zeros(vocab, device=device)
        for token, bias in self.params.logit_bias:
            self._offset[token] = bias
        if self.params.repetition_penalty != 1.0:
            self._seen = torch.zeros(vocab, dtype=torch.bool, device=device)
            self._seen[torch.tensor(self._prompt_ids, device=device)] = True
        for token in self._early:
            self._count(token)
        self._early = []
