"""How many prompt tokens an engine step may prefill: the whole prefill_chunk while nothing decodes
(a first token as soon as it can be), and while sequences decode only as many as fit `stall_s` at
the speed the last prefill calls took. A fixed chunk stalls the running streams for however long
it takes the model, seconds at 1B on 2 cores (docs/benchmarks.md, "The sizes users serve");
paced, the gap stays near stall_s whatever the model's size, and a long prompt is prefilled in
more, shorter steps."""
from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

from handler.engine.compiled.shapes import PREFILL_PAD


class PrefillPace:
    def __init__(self, chunk: int, stall_s: float | None, clock: Callable[[], float] = time.perf_counter):
        """`stall_s` None: every step may prefill `chunk` padded tokens."""
        self.chunk, self.stall_s, self._clock = chunk, stall_s, clock
        self._token_s: float | None = None  # seconds a prefilled token took: the last calls', averaged

    def budget(self, decoding: bool) -> int:
        """Padded tokens this step may prefill (a multiple of PREFILL_PAD, at least one)."""
        if not decoding or self.stall_s is None or self._token_s is None:
            return self.chunk
        fits = int(self.stall_s / self._token_s) // PREFILL_PAD * PREFILL_PAD
        return min(self.chunk, max(PREFILL_PAD, fits))

    @contextlib.contextmanager
    def timing(self, tokens: int) -> Iterator[None]:
        """Times a prefill call of `tokens` prompt tokens (synchronous: a CPU step)."""
        start = self._clock()
        yield
        token_s = (self._clock() - start) / tokens
        self._token_s = token_s if self._token_s is None else (self._token_s + token_s) / 2
