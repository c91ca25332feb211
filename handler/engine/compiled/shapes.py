"""The shapes the Engine calls its steps with, which AOT compiling must cover: how it pads them
(prefill_width pads chunks, decode_window sizes windows), every batch, chunk width and attention
window serving can produce, and the order their example shapes are compiled in."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch

from handler.engine.config import EngineConfig
from handler.engine.kv.pages import page_columns
from handler.engine.model.transformer import Transformer

StepName = Literal["prefill", "decode"]

# Chunks are right-padded to a multiple of this: fewer distinct shapes, and a prompt the prefix
# cache mostly holds prefills a few rows, not 16.
PREFILL_PAD = 4
KV_BUCKET = 64  # decode attends to a multiple of this many positions


def decode_window(positions: int, max_seq_len: int) -> int:
    """How many cached positions a decode step attends to when the furthest sequence needs
    `positions`: the next multiple of KV_BUCKET (compiled graphs take the window as a symbol)."""
    return min(-(-positions // KV_BUCKET) * KV_BUCKET, max_seq_len)


def prefill_width(longest_chunk: int, limit: int) -> int:
    """The padded width of a prefill whose longest chunk has `longest_chunk` tokens (at most
    `limit`: the chunk size, or max_seq_len when that is smaller)."""
    return min(-(-longest_chunk // PREFILL_PAD) * PREFILL_PAD, limit)


@dataclass(frozen=True)
class Shape:
    batch: int
    length: int  # T (chunk width) for prefill, kv_len (attention window) for decode
    window: int = 0  # prefill's kv_len (attention window)

    def entry(self, file: str) -> dict[str, Any]:
        """How a saved graph and its example shape are listed (the artifact index)."""
        return {"file": file, "batch": self.batch, "length": self.length, "window": self.window}

    @classmethod
    def of_entry(cls, entry: dict[str, Any]) -> Shape:
        return cls(entry["batch"], entry["length"], entry["window"])


# ---- the shapes serving can produce -----------------------------------------------------------

def example_args(step: StepName, shape: Shape, cfg: EngineConfig) -> tuple[Any, ...]:
    """Arguments of model.<step> with this shape (values do not matter to the guards; every page
    table entry is page 0)."""
    b, n, device = shape.batch, shape.length, torch.device(cfg.device)
    pages = torch.zeros(b, page_columns(cfg.max_seq_len), dtype=torch.long, device=device)
    if step == "prefill":
        return (torch.zeros(b, n, dtype=torch.long, device=device), pages,
                torch.zeros(b, dtype=torch.long, device=device), torch.full((b,), n - 1, device=device), shape.window)
    return (torch.zeros(b, dtype=torch.long, device=device), pages, torch.full((b,), n - 1, device=device), n)


def serving_shapes(step: StepName, cfg: EngineConfig) -> list[Shape]:
    """Every shape the Engine can call `step` with: 1..max_batch_size sequences; chunks padded
    as prefill_width pads them, attention windows as decode_window makes them.

    Prefill has a (width, window) pair for each chunk width and each window a chunk of that
    width can end in; each pair at batch 1 and at the largest batch, every batch at the first
    pair (the batch is unbacked: no guard ties it to the lengths; ~2,000 shapes, not ~20,000)."""
    positions = range(1, cfg.max_seq_len + 1)
    if step == "prefill":
        return _prefill_shapes(cfg)
    return sorted({Shape(b, decode_window(n, cfg.max_seq_len)) for n in positions for b in range(1, cfg.max_batch_size + 1)},
                  key=lambda s: (s.length, s.batch))


def _prefill_shapes(cfg: EngineConfig) -> list[Shape]:
    limit = min(cfg.prefill_chunk, cfg.max_seq_len)
    pairs = []
    for width in sorted({prefill_width(n, limit) for n in range(1, limit + 1)}):
        shortest = min(n for n in range(1, limit + 1) if prefill_width(n, limit) == width)
        pairs += [(width, w) for w in sorted({decode_window(p, cfg.max_seq_len) for p in range(shortest, cfg.max_seq_len + 1)})]
    most = cfg.max_batch_size
    shapes = [Shape(b, *pairs[0]) for b in range(1, most + 1)]
    return shapes + [Shape(b, *pair) for pair in pairs[1:] for b in sorted({1, most})]


def compile_order(shapes: list[Shape], model_sizes: set[int]) -> list[Shape]:
    """The shapes, led by a representative at sizes equal to no dimension of the model, then
    batch 1. An example size that equals a model dimension (16 slots, 64 head dims) may get
    specialized to that value; the coverage loop would stay correct, only compile more graphs."""
    plain = [s for s in shapes if s.length not in model_sizes and s.window not in model_sizes] or shapes
    batches = sorted({s.batch for s in shapes if s.batch >= 2})
    batch = next((b for b in batches if b not in model_sizes), batches[0] if batches else 1)
    ref = plain[0]
    first = ([Shape(batch, ref.length, ref.window)] if batches else []) + [Shape(1, ref.length, ref.window)]
    return first + [s for s in shapes if s not in first]


def model_sizes(model: Transformer) -> set[int]:
    return {d for t in (*model.parameters(), *model.buffers()) for d in t.shape}
