"""A sequence's logit controls, applied to its row of logits after the compiled step and before
sampling: logit_bias, min_tokens, repetition_penalty, presence_penalty and frequency_penalty, as
OpenAI and vLLM define them. Each row keeps its own dense [V] state, so one request's controls
never touch another's row and a step costs a few vector ops per row, whatever the length."""
from __future__ import annotations

import torch
from torch import Tensor

from handler.engine.sampling import SamplingParams


class LogitControls:
    def __init__(self, params: SamplingParams, prompt_ids: list[int], end_ids: frozenset[int]):
        self.params = params
        self._prompt_ids = prompt_ids
        self._end_ids = sorted(end_ids | set(params.stop_token_ids))  # held back until min_tokens
        self._generated = 0
        self._bias: Tensor | None = None  # [V] float32, logit_bias
        self._counts: Tensor | None = None  # [V] float32, each token's count in the output
        self._seen: Tensor | None = None  # [V] bool, tokens of the prompt or the output

    @classmethod
    def for_params(cls, params: SamplingParams, prompt_ids: list[int], end_ids: frozenset[int]) -> LogitControls | None:
        return cls(params, prompt_ids, end_ids) if params.controls_logits else None

    def apply(self, logits: Tensor) -> None:
        """logits: [V] float32, in place."""
        if self._counts is None:
            self._allocate(logits.shape[-1], logits.device)
        assert self._bias is not None and self._counts is not None and self._seen is not None
        p = self.params
        if p.logit_bias:
            logits += self._bias
        if self._generated < p.min_tokens:
            logits[self._end_ids] = float("-inf")
        if p.repetition_penalty != 1.0:
            penalized = torch.where(logits > 0, logits / p.repetition_penalty, logits * p.repetition_penalty)
            logits.copy_(torch.where(self._seen, penalized, logits))
        if p.frequency_penalty:
            logits -= p.frequency_penalty * self._counts
        if p.presence_penalty:
            logits -= p.presence_penalty * (self._counts > 0).float()

    def accept(self, token: int) -> None:
        self._generated += 1
        if self._counts is not None and self._seen is not None:
            self._counts[token] += 1
            self._seen[token] = True

    def _allocate(self, vocab: int, device: torch.device) -> None:
        self._bias = torch.zeros(vocab, device=device)
        for token, bias in self.params.logit_bias:
            self._bias[token] = bias
        self._counts = torch.zeros(vocab, device=device)
        self._seen = torch.zeros(vocab, dtype=torch.bool, device=device)
        self._seen[torch.tensor(self._prompt_ids, device=device)] = True
