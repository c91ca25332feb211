"""Faithful answers (issue 61): the default model's greedy answers on each activations setting
against its unrounded self, and the README demo's answer.

    .venv/bin/python -m bench.answers

The prompts are bench/data/answers.json: the demo's question and 20 short factual and instruction
prompts, each through the chat template, greedy, 48 tokens. The reference is the same file's
weights dequantized, multiplied in float32 with x as it is (no rounding), float32 activations and
KV cache (eager). Each served path runs as a worker runs it (compiled steps, `dtype: auto`), once
per `activations` setting. A path's answer counts as identical when every token equals the
reference's. Writes docs/results/answers.json, the reference's tokens to
tests/fixtures/answers_reference.json (tests hold the default path to them) and the "Faithful
answers" section of docs/benchmarks.md.
"""
from __future__ import annotations

import argparse
import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch.nn.functional as F

from bench.common import REPO, versions, write_json, write_section
from handler.engine.config import ACTIVATION_ROUNDS, EngineConfig
from handler.engine.convert import ensure_default_checkpoint
from handler.engine.factory import build_engine
from handler.engine.quant import ops
from handler.engine.sampling import SamplingParams
from handler.engine.tokenizer import Tokenizer

PROMPTS = Path(__file__).resolve().parent / "data" / "answers.json"
FIXTURE = REPO / "tests" / "fixtures" / "answers_reference.json"
NEW_TOKENS = 48


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--activations", nargs="+", default=list(ACTIVATION_ROUNDS), choices=list(ACTIVATION_ROUNDS))
    return p.parse_args()


def questions() -> list[str]:
    """The demo's question first, then the 20 prompts."""
    data = json.loads(PROMPTS.read_text())
    return [data["demo"], *data["prompts"]]


@contextlib.contextmanager
def unrounded() -> Iterator[None]:
    """Quantized products as x @ dequantize(w).T in float32, x not rounded (eager calls only)."""
    plain = ops.quantized_linear

    def product(x, w, bias=None, rounds=1):
        y = F.linear(x.float(), ops.dequantize(w), None if bias is None else bias.float())
        return y.to(x.dtype)

    ops.quantized_linear = product
    try:
        yield
    finally:
        ops.quantized_linear = plain


def answers(cfg: EngineConfig, texts: list[str]) -> tuple[list[list[int]], str]:
    """Greedy answers to `texts` through the chat template, all in one batch (a row's tokens do not
    depend on its batch), and the engine path."""
    loaded = build_engine(cfg)
    engine, tok = loaded.engine, loaded.engine.tokenizer
    params = SamplingParams(max_new_tokens=NEW_TOKENS)
    for i, text in enumerate(texts):
        engine.add(f"q{i}", tok.encode_chat([{"role": "user", "content": text}]), params)
    out: dict[str, list[int]] = {f"q{i}": [] for i in range(len(texts))}
    while engine.running:
        for event in engine.step():
            out[event.request_id].extend(event.token_ids)
    return [out[f"q{i}"] for i in range(len(texts))], loaded.path


def agreement(got: list[list[int]], ref: list[list[int]]) -> float:
    """The share of the reference's tokens that the answer has at the same position."""
    return sum(x == y for a, b in zip(got, ref) for x, y in zip(a, b)) / sum(len(b) for b in ref)


def main() -> None:
    args = parse_args()
    checkpoint = ensure_default_checkpoint(REPO / "artifacts" / "checkpoints" / "smollm2-135m-instruct")
    texts = questions()
    common: dict[str, Any] = {"checkpoint_dir": checkpoint, "max_batch_size": len(texts), "max_seq_len": 256}
    with unrounded():
        ref, ref_path = answers(EngineConfig(**common, compile="eager", quantization="gguf", dtype="float32"), texts)
    tok = Tokenizer.from_dir(checkpoint)
    paths = {}
    for activations in args.activations:
        got, path = answers(EngineConfig(**common, activations=activations, warm_start="blocking"), texts)
        same = [a == b for a, b in zip(got[1:], ref[1:])]
        paths[activations] = {
            "engine_path": path, "prompts": len(same), "identical": sum(same),
            "token_agreement": agreement(got[1:], ref[1:]),
            "demo_identical": got[0] == ref[0], "paris": "Paris" in tok.decode(got[0]), "demo_answer": tok.decode(got[0]),
            "answers": [tok.decode(a) for a in got]}
        print(activations, {k: v for k, v in paths[activations].items() if k != "answers"}, flush=True)
    default = paths.get(EngineConfig.activations, {})
    result = {"versions": versions(), "new_tokens": NEW_TOKENS, "reference_path": ref_path,
              "reference_answers": [tok.decode(a) for a in ref],
              "demo": {"prompts": default.get("prompts"), "identical": default.get("identical"),
                       "paris": default.get("paris"), "activations": EngineConfig.activations},
              "paths": paths}
    write_json("answers.json", result)
    FIXTURE.write_text(json.dumps({"about": "bench/answers.py: the default model's unrounded greedy answers "
                                   "(tokens) to bench/data/answers.json, demo first", "tokens": ref}) + "\n")
    write_section("answers", markdown(result))


def markdown(r: dict) -> str:
    rows = "\n".join(f"| `{a}` | {p['engine_path']} | {p['identical']}/{p['prompts']} | {p['token_agreement']:.3f} | "
                     f"{'yes' if p['demo_identical'] else 'no'} | {p['demo_answer'].strip()[:60]!r} |"
                     for a, p in r["paths"].items())
    return f"""## Faithful answers

`.venv/bin/python -m bench.answers` on {r['versions']['machine']} ({r['versions']['cpu_profile']}): the default
model's greedy answers ({r['new_tokens']} tokens, chat template) to `bench/data/answers.json` on each
`activations` setting, compiled as a worker runs them, against its unrounded self (the same file's
weights dequantized, x not rounded, float32 activations and KV cache; {r['reference_path']}, eager).
The reference answers the demo {r['reference_answers'][0].strip()!r}.

| activations | path | identical answers | reference tokens matched | demo identical | demo's answer |
|---|---|---|---|---|---|
{rows}
"""


if __name__ == "__main__":
    main()
