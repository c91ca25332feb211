"""Running prompts to completion on an engine, as an offline caller would: the engine tests' helper."""
from __future__ import annotations

from handler.engine.engine import Engine
from handler.engine.sampling import SamplingParams


def generate(engine: Engine, prompts: list[list[int]], params: list[SamplingParams]) -> list[list[int]]:
    """Each prompt's generated tokens (as many at once as there are slots)."""
    pending = list(enumerate(prompts))
    done: dict[str, list[int]] = {}
    while pending or engine.running:
        while pending and engine.free_slots:
            i, ids = pending.pop(0)
            engine.add(str(i), ids, params[i])
        for out in engine.step():
            done.setdefault(out.request_id, []).extend(out.token_ids)
    return [done[str(i)] for i in range(len(prompts))]
