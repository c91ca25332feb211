"""Structured output's own cost: compiling a JSON schema and masking one token's logits
(handler.engine.grammar, llguidance), per schema, on the default model's tokenizer.

    .venv/bin/python -m bench.grammar

Each schema is spelled token by token from seeded random logits (masked, argmax), as the worst
model would: what every constrained sequence adds to a decode step. Writes
docs/results/grammar.json and the Structured output section of docs/benchmarks.md.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from bench.common import REPO, versions, write_json, write_section
from handler.engine.checkpoint import open_checkpoint
from handler.engine.convert import ensure_default_checkpoint
from handler.engine.grammar import ANY_OBJECT, Grammars, schema_text
from handler.engine.tokenizer import Tokenizer

SCHEMAS = {
    "person (object, string, integer, enum array)": schema_text({
        "type": "object", "additionalProperties": False, "required": ["name", "age", "pets"],
        "properties": {"name": {"type": "string", "maxLength": 16}, "age": {"type": "integer", "minimum": 0},
                       "pets": {"type": "array", "items": {"enum": ["cat", "dog", "fish"]}, "maxItems": 3}}}),
    "json_object (any object)": ANY_OBJECT,
    "long string (bench/serve.py's)": schema_text({"type": "object", "required": ["answer"],
                                                   "properties": {"answer": {"type": "string", "minLength": 200}}}),
}
TOKENS = 64  # per sequence, at most
SEQUENCES = 20


def measure(grammars: Grammars, schema: str, vocab: int) -> dict:
    start = time.perf_counter()
    grammars.grammar(schema)
    compile_s = time.perf_counter() - start
    mask_us, accept_us = [], []
    for seed in range(SEQUENCES):
        gen = torch.Generator().manual_seed(seed)
        matcher = grammars.matcher(schema)
        for _ in range(TOKENS):
            if matcher.complete:
                break
            logits = torch.randn(vocab, generator=gen)
            t0 = time.perf_counter()
            matcher.mask_logits(logits)
            t1 = time.perf_counter()
            token = int(logits.argmax())
            t2 = time.perf_counter()
            matcher.accept(token)
            t3 = time.perf_counter()
            mask_us.append((t1 - t0) * 1e6)
            accept_us.append((t3 - t2) * 1e6)
    mask_us.sort()
    return {"compile_ms": compile_s * 1e3, "tokens": len(mask_us), "mask_us_mean": statistics.fmean(mask_us),
            "mask_us_p99": mask_us[int(0.99 * (len(mask_us) - 1))], "accept_us_mean": statistics.fmean(accept_us)}


def main() -> None:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    checkpoint = ensure_default_checkpoint(REPO / "artifacts" / "checkpoints" / "smollm2-135m-instruct")
    vocab = open_checkpoint(checkpoint).args.vocab_size
    tok = Tokenizer.from_dir(checkpoint)
    start = time.perf_counter()
    grammars = Grammars(tok.backend.to_str(), vocab, tok.eos_ids)
    grammars.grammar(schema_text({"type": "boolean"}))  # builds the tokenizer's tables once
    first_s = time.perf_counter() - start
    rows = {name: measure(grammars, schema, vocab) for name, schema in SCHEMAS.items()}
    result = {"vocab": vocab, "first_schema_s": first_s, "schemas": rows, "versions": versions(),
              "command": ".venv/bin/python -m bench.grammar"}
    write_json("grammar.json", result)
    write_section("grammar", markdown(result))
    for name, r in rows.items():
        print(f"{name}: mask {r['mask_us_mean']:.0f} us (p99 {r['mask_us_p99']:.0f}), accept {r['accept_us_mean']:.0f} us")


def markdown(r: dict) -> str:
    rows = "\n".join(f"| {name} | {x['compile_ms']:.1f} | {x['tokens']} | {x['mask_us_mean']:.0f} / {x['mask_us_p99']:.0f} | "
                     f"{x['accept_us_mean']:.0f} |" for name, x in r["schemas"].items())
    v = r["versions"]
    return f"""## Structured output: the grammar's cost per token

Command: `{r['command']}`. llguidance on the default model's tokenizer ({r['vocab']} tokens), one
thread, {v['machine']}. Each schema is spelled by {SEQUENCES} sequences from seeded random logits
(masked, then argmax), up to {TOKENS} tokens each: the mask and the accepted token are what a
constrained sequence adds to a decode step, outside the compiled graphs. The first schema also
builds the tokenizer's tables: {r['first_schema_s']:.2f} s, once per worker.

| schema | compile (ms) | tokens | mask mean / p99 (us) | accept mean (us) |
|---|---|---|---|---|
{rows}

For scale: a batch-16 decode step of the default model takes tens of milliseconds here, so 16
constrained sequences add a few percent; `bench/serve.py` measures it end to end
(`json_schema_throughput_ratio`, Serving section).
"""


if __name__ == "__main__":
    main()
