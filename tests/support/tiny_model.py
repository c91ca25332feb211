"""Engines small enough for unit tests: no checkpoint, no tokenizer files, no compiling.

Two kinds of steps drive the real `Engine`:
- `CountingSteps`: fake prefill and decode whose greedy next token is the last token plus one,
  so every output is known in advance ("abc" continues "def...", "z" is followed by EOS);
  they record each call's shape, so tests can see how the engine batched its work.
- `tiny_transformer`: the real `Transformer` with tiny ModelArgs and seeded random weights, for
  what only a model with a KV cache can show (a batch decodes as each sequence alone would).

Both use `CharTokenizer`: one id per letter, id 0 is EOS.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

from handler.engine.engine import Engine
from handler.engine.kv.pages import pages_for
from handler.engine.model.args import ModelArgs
from handler.engine.model.transformer import Transformer

ALPHABET = "abcdefghijklmnopqrstuvwxyz"
EOS_ID = 0
VOCAB_SIZE = len(ALPHABET) + 1  # EOS, then one id per letter


class CharTokenizer:
    """What the engine and the service use of handler.engine.tokenizer.Tokenizer, one id per
    letter. A chat is its messages' contents, joined."""

    eos_ids = frozenset({EOS_ID})

    def encode(self, text: str) -> list[int]:
        return [ALPHABET.index(c) + 1 for c in text]

    def decode(self, ids: list[int]) -> str:
        # As the real tokenizer skips special tokens: EOS (under ignore_eos) adds no text.
        return "".join(ALPHABET[i - 1] for i in ids if i != EOS_ID)

    def token_text(self, token_id: int) -> str:
        return self.decode([token_id])

    def encode_chat(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        return self.encode("".join(m["content"] for m in messages))


@dataclass
class CountingSteps:
    """Prefill and decode with the Engine's signatures; the logits make `last token + 1` (mod
    the vocabulary) the greedy choice."""

    vocab_size: int = VOCAB_SIZE
    calls: list[tuple[str, int, int]] = field(default_factory=list)  # (step, batch, width or kv_len)

    def prefill(self, tokens: Tensor, pages: Tensor, start_pos: Tensor, last_index: Tensor, kv_len: int) -> Tensor:
        self.calls.append(("prefill", tokens.shape[0], tokens.shape[1]))
        return self._logits(tokens[torch.arange(tokens.shape[0]), last_index])

    def decode(self, tokens: Tensor, pages: Tensor, input_pos: Tensor, kv_len: int) -> Tensor:
        self.calls.append(("decode", tokens.shape[0], kv_len))
        return self._logits(tokens)

    def _logits(self, last: Tensor) -> Tensor:
        return F.one_hot((last + 1) % self.vocab_size, self.vocab_size).float() * 10.0

    def of(self, step: str) -> list[tuple[int, int]]:
        return [(batch, n) for name, batch, n in self.calls if name == step]


def counting_engine(slots: int = 4, max_seq_len: int = 64, **options) -> tuple[Engine, CountingSteps]:
    """options: Engine's own (prefill_chunk, prefix_caching: its prefix copies are no-ops, as the
    counting steps keep no KV)."""
    steps = CountingSteps()
    return Engine(steps.prefill, steps.decode, CharTokenizer(), slots, max_seq_len, torch.device("cpu"),
                  copy_page=lambda src, dst: None, **options), steps


TINY_ARGS = ModelArgs(vocab_size=VOCAB_SIZE, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8,
                      intermediate_size=64, norm_eps=1e-5, rope_theta=10000.0)


def tiny_transformer(pages: int, max_seq_len: int, seed: int = 0) -> Transformer:
    """The real model with TINY_ARGS in float32: weights drawn from `seed` alone (built on the
    meta device, so the global RNG is left untouched), norms at one, a KV cache of `pages` pages."""
    with torch.device("meta"):
        model = Transformer(TINY_ARGS)
    model = model.to_empty(device="cpu")
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            else:
                # Unit-variance activations, so the logits spread over ~1: no near-ties that
                # rounding in a batched matmul could flip.
                scale = 1.0 if "embeddings" in name else param.shape[1] ** -0.5
                param.copy_(torch.randn(param.shape, generator=gen) * scale)
    model.eval().requires_grad_(False)
    model.setup_cache(pages, max_seq_len)
    return model


def tiny_engine(slots: int = 4, max_seq_len: int = 64, seed: int = 0, pages: int | None = None, **options) -> Engine:
    """options: Engine's own (prefill_chunk, prefix_caching); `pages` of the KV cache, default
    max_seq_len positions per slot."""
    pages = slots * pages_for(max_seq_len) if pages is None else pages
    model = tiny_transformer(pages, max_seq_len, seed)
    return Engine(model.prefill, model.decode, CharTokenizer(), slots, max_seq_len, torch.device("cpu"),
                  copy_page=model.copy_page, pages=pages, **options)
