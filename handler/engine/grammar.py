"""Structured output: decoding constrained to a JSON schema, one matcher per sequence.

A matcher (llguidance's LLMatcher) knows which tokens may come next for its grammar; the engine
sets every other token's logit to -inf before sampling (mask_logits) and feeds it the sampled
token (accept). This runs on each row of the logits outside the compiled graphs, so constrained
and free sequences share a batch and the graphs stay as they are.

llguidance, not xgrammar or outlines-core: no dependencies of its own (xgrammar pulls triton and
transformers), a tokenizer read from tokenizer.json, and a mask of the default model's whole
vocabulary in a fraction of a millisecond, applied (bench/grammar.py; docs/benchmarks.md,
Structured output).
"""
from __future__ import annotations

import functools
import json

import llguidance
import torch
from torch import Tensor

from handler.engine import EngineError

# Compact JSON: no free whitespace between tokens. With it, a small model can emit spaces or
# newlines until max_tokens and still satisfy the grammar.
JSON_OPTIONS: llguidance._lib.JsonCompileOptions = {"whitespace_flexible": False}
ANY_OBJECT = '{"type": "object"}'  # OpenAI's response_format {"type": "json_object"}


class GrammarError(EngineError, ValueError):
    """A schema the grammar engine cannot use; the message says why (for a 400)."""


class Grammars:
    """Compiles JSON schemas for one tokenizer and makes a matcher per sequence."""

    def __init__(self, tokenizer_json: str, vocab_size: int, eos_ids: frozenset[int]):
        # vocab_size: the model's logits width (a checkpoint may pad it past the tokenizer's)
        self._args = tokenizer_json, vocab_size, sorted(eos_ids)

    @functools.cached_property
    def _tokenizer(self) -> llguidance.LLTokenizer:
        # Built at the first schema, not at start: a replica without such requests never pays for it.
        tokenizer_json, vocab_size, eos_ids = self._args
        return llguidance.LLTokenizer(tokenizer_json, n_vocab=vocab_size, eos_token=eos_ids)

    @functools.lru_cache(maxsize=64)  # noqa: B019 - chat traffic repeats its schemas; one Grammars per engine
    def grammar(self, schema: str) -> str:
        """The grammar of a JSON schema (JSON text), or GrammarError saying what is wrong with it."""
        try:
            grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
        except ValueError as err:  # not JSON, or not a schema it can compile
            raise GrammarError(f"invalid JSON schema: {err}") from err
        problem = llguidance.LLMatcher.validate_grammar(grammar, self._tokenizer)
        if problem:
            raise GrammarError(f"invalid JSON schema: {problem}")
        return grammar

    def matcher(self, schema: str) -> Matcher:
        matcher = llguidance.LLMatcher(self._tokenizer, self.grammar(schema), log_level=0)
        if matcher.is_error():  # it raises nothing: a grammar over its limits leaves it in an error state
            raise GrammarError(f"invalid JSON schema: {matcher.get_error()}")
        return Matcher(matcher)


class Matcher:
    """One sequence's grammar state."""

    def __init__(self, matcher: llguidance.LLMatcher):
        self._m = matcher

    def mask_logits(self, logits: Tensor) -> None:
        """logits: [V] float, in place: -inf for every token the grammar does not allow next."""
        allowed = torch.frombuffer(bytearray(self._m.compute_logit_bias()), dtype=torch.uint8)  # [V]: 0 or 200
        logits.masked_fill_(allowed.to(logits.device) == 0, float("-inf"))

    def accept(self, token: int) -> None:
        if not self._m.consume_token(token):
            # The mask allowed only tokens the grammar accepts: this is a bug, not a user error.
            raise RuntimeError(f"the grammar refused token {token} it allowed: {self._m.get_error()}")

    @property
    def complete(self) -> bool:
        """The output satisfies the grammar and nothing may follow (only end of sequence)."""
        return self._m.is_stopped()


def schema_text(schema: object) -> str:
    """A schema as compact JSON text (the grammar cache's key), in its own key order: an object's
    properties are written in the order the schema gives them, as OpenAI's structured outputs do."""
    return json.dumps(schema, separators=(",", ":"))
