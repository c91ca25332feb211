"""Batch invariance (issue 62): whether a greedy request's tokens depend on what else is batched
with it, or on how its prompt was prefilled, on the default model's served path (compiled steps).

    .venv/bin/python -m bench.determinism

Each prompt (bench/data/answers.json: the demo's question and 20 prompts, chat template, greedy,
48 tokens) runs
- alone: one request at a time (prefill at batch 1, decode at batch 1);
- together: every prompt added at once (one prefill batch, every row decoded together);
- chunked: every prompt at once under prefill_chunk 16 (each prompt prefilled 16 tokens a step,
  beside the others' decode steps);
- resumed: every prompt at once again, each followed by the first RESUME_AT tokens it got alone,
  prefilled as a resumed stream's context is on a fresh replica, for the rest of its tokens.
A request is invariant when its tokens are the same all four ways; where they part, the first
position that differs is recorded. Writes docs/results/determinism.json and the determinism
section of docs/benchmarks.md.
"""
from __future__ import annotations

import dataclasses
import sys
import time

from bench.answers import NEW_TOKENS, questions
from bench.common import REPO, versions, write_json, write_section
from handler.engine.config import EngineConfig
from handler.engine.convert import ensure_default_checkpoint
from handler.engine.engine import Engine
from handler.engine.factory import build_engine
from handler.engine.sampling import SamplingParams

CHUNK = 16
RESUME_AT = NEW_TOKENS // 2  # where the resumed run takes over
WAYS = ("together", "chunked", "resumed")


def resumed(engine: Engine, prompts: list[list[int]], alone: list[list[int]]) -> list[list[int]]:
    """Each answer's first RESUME_AT tokens (alone), then what the engine generates after them
    with them prefilled as part of the prompt."""
    params = SamplingParams(max_new_tokens=NEW_TOKENS - RESUME_AT)
    out: dict[str, list[int]] = {}
    for i, (ids, answer) in enumerate(zip(prompts, alone)):
        engine.add(f"r{i}", ids + answer[:RESUME_AT], params)
        out[f"r{i}"] = list(answer[:RESUME_AT])
    while engine.running:
        for event in engine.step():
            out[event.request_id].extend(event.token_ids)
    return [out[f"r{i}"] for i in range(len(prompts))]


def run(engine: Engine, prompts: list[list[int]], together: bool) -> tuple[list[list[int]], float]:
    """Greedy answers (all at once or one at a time) and the seconds they took."""
    params = SamplingParams(max_new_tokens=NEW_TOKENS)
    out: dict[str, list[int]] = {}
    start = time.perf_counter()
    for group in [list(enumerate(prompts))] if together else [[p] for p in enumerate(prompts)]:
        for i, ids in group:
            engine.add(f"q{i}", ids, params)
            out[f"q{i}"] = []
        while engine.running:
            for event in engine.step():
                out[event.request_id].extend(event.token_ids)
    return [out[f"q{i}"] for i in range(len(prompts))], time.perf_counter() - start


def first_difference(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else min(len(a), len(b)))


def main() -> None:
    checkpoint = ensure_default_checkpoint(REPO / "artifacts" / "checkpoints" / "smollm2-135m-instruct")
    texts = questions()
    cfg = EngineConfig(checkpoint, max_batch_size=len(texts), max_seq_len=256, warm_start="blocking")
    loaded = build_engine(cfg)
    tok = loaded.engine.tokenizer
    prompts = [tok.encode_chat([{"role": "user", "content": t}]) for t in texts]
    alone, alone_s = run(loaded.engine, prompts, together=False)
    together, together_s = run(loaded.engine, prompts, together=True)
    again = resumed(loaded.engine, prompts, alone)
    chunked, chunked_s = run(build_engine(dataclasses.replace(cfg, prefill_chunk=CHUNK)).engine, prompts, together=True)
    rows = [{"prompt": t, "tokens": len(p), "together_differs_at": first_difference(a, b),
             "chunked_differs_at": first_difference(a, c), "resumed_differs_at": first_difference(a, d)}
            for t, p, a, b, c, d in zip(texts, prompts, alone, together, chunked, again)]
    same = sum(all(r[f"{way}_differs_at"] is None for way in WAYS) for r in rows)
    result = {"versions": versions(), "engine_path": loaded.path, "new_tokens": NEW_TOKENS, "resume_at": RESUME_AT,
              "requests": len(rows), "batch_invariant_identical": same,
              **{f"{way}_identical": sum(r[f"{way}_differs_at"] is None for r in rows) for way in WAYS},
              "seconds": {"alone": alone_s, "together": together_s, "chunked": chunked_s}, "requests_detail": rows}
    print({k: v for k, v in result.items() if k != "requests_detail"}, flush=True)
    write_json("determinism.json", result)
    write_section("determinism", markdown(result, " ".join(sys.argv[1:])))


def markdown(r: dict, argv: str) -> str:
    def at(d: dict, way: str) -> str:
        return "same" if d[f"{way}_differs_at"] is None else str(d[f"{way}_differs_at"])

    rows = [f"| {i} | {d['tokens']} | " + " | ".join(at(d, way) for way in WAYS) + " |"
            for i, d in enumerate(r["requests_detail"])]
    return "\n".join([
        "## Batch invariance (bench.determinism)",
        "",
        f"`python -m bench.determinism {argv}`: the default model on its served path ({r['engine_path']}, compiled), "
        f"{r['requests']} greedy requests of {r['new_tokens']} tokens (bench/data/answers.json, chat template), alone, "
        f"together, together with prompts prefilled {CHUNK} tokens a step, and resumed after {r['resume_at']} "
        f"tokens (those prefilled); {r['versions']['machine']}, {r['versions']['cpu_profile']}. "
        f"**{r['batch_invariant_identical']} of {r['requests']}** get the same tokens all four ways (together "
        f"{r['together_identical']}, chunked {r['chunked_identical']}, resumed {r['resumed_identical']}); where not, the "
        "first generated position that differs from the request alone:",
        "",
        "| request | prompt tokens | together | chunked | resumed |",
        "|---|---|---|---|---|",
        *rows,
    ])


if __name__ == "__main__":
    main()
