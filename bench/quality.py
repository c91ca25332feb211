"""Quality of quantized weights, measured: perplexity on a fixed text (bench/data/quality.txt,
public-domain prose and two plain paragraphs) and agreement with the bf16 weights, for each
`quantization` setting of the engine on the default model.

    .venv/bin/python -m bench.quality

Agreement is measured two ways: teacher-forced (on the text, the share of positions whose
most likely next token equals bf16's) and free-running (greedy continuations of fixed prompts:
the share of the 32 generated tokens equal to bf16's at the same position, and how many of the
continuations are identical). Eager engine, the machine's default dtype. Writes
docs/results/quality.json and the Quality section of docs/benchmarks.md.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch

from bench.common import versions, write_json, write_section
from bench.load import PROMPTS
from handler.engine.config import EngineConfig, Quantization
from handler.engine.convert import ensure_default_checkpoint
from handler.engine.factory import build_engine
from handler.engine.sampling import SamplingParams

TEXT = Path(__file__).resolve().parent / "data" / "quality.txt"
VARIANTS = ("none", "int8", "int4", "gguf")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", type=Path, default=None)
    p.add_argument("--variants", nargs="+", default=list(VARIANTS))
    p.add_argument("--new-tokens", type=int, default=32)
    return p.parse_args()


def all_logits(model, tokens: torch.Tensor) -> torch.Tensor:
    """Next-token logits [T, V] at every position of one sequence (Transformer.prefill keeps only the
    last), through the model's slot 0: the model's cache must hold T positions."""
    with torch.no_grad():
        x = model.hidden(tokens, torch.tensor([0]), torch.tensor([0]), tokens.shape[1])
        return model.output(model.norm(x[0])).float()


def greedy(engine, prompts: list[list[int]], n: int) -> list[list[int]]:
    params = SamplingParams(max_new_tokens=n, ignore_eos=True)
    for i, ids in enumerate(prompts):
        engine.add(f"p{i}", ids, params)
    out: dict[str, list[int]] = {f"p{i}": [] for i in range(len(prompts))}
    while engine.running:
        for event in engine.step():
            out[event.request_id].extend(event.token_ids)
    return [out[f"p{i}"] for i in range(len(prompts))]


def measure(checkpoint: Path, quantization: Quantization, args) -> dict:
    loaded = build_engine(EngineConfig(checkpoint, compile="eager", quantization=quantization, max_batch_size=len(PROMPTS),
                                       max_seq_len=1024))
    tok = loaded.engine.tokenizer
    ids = torch.tensor([tok.encode(TEXT.read_text())])
    logits = all_logits(loaded.model, ids)
    nll = torch.nn.functional.cross_entropy(logits[:-1], ids[0, 1:])
    prompts = [tok.encode(p) for p in PROMPTS]
    return {"path": loaded.path, "tokens": ids.shape[1], "perplexity": float(nll.exp()),
            "argmax": logits[:-1].argmax(-1), "greedy": greedy(loaded.engine, prompts, args.new_tokens)}


def main() -> None:
    args = parse_args()
    checkpoint = args.checkpoint or ensure_default_checkpoint(Path("artifacts/checkpoints/smollm2-135m-instruct"))
    runs = {q: measure(checkpoint, q, args) for q in args.variants}
    ref = runs["none"]
    result = {"versions": versions(), "text_tokens": ref["tokens"], "prompts": len(PROMPTS), "new_tokens": args.new_tokens,
              "variants": {}}
    for q, r in runs.items():
        same = [sum(a == b for a, b in zip(g, rg)) for g, rg in zip(r["greedy"], ref["greedy"])]
        result["variants"][q] = {
            "engine_path": r["path"], "perplexity": r["perplexity"],
            "perplexity_over_bf16": r["perplexity"] / ref["perplexity"],
            "teacher_forced_top1_agreement": float((r["argmax"] == ref["argmax"]).float().mean()),
            "greedy_token_agreement": sum(same) / (len(same) * args.new_tokens),
            "greedy_identical_continuations": sum(s == args.new_tokens for s in same)}
        print(q, dict(result["variants"][q]), flush=True)
    write_json("quality.json", result)
    write_section("quality", markdown(result))


def markdown(r: dict) -> str:
    rows = "\n".join(
        f"| {q} | {v['perplexity']:.3f} | {v['perplexity_over_bf16']:.3f} | {v['teacher_forced_top1_agreement']:.3f} | "
        f"{v['greedy_token_agreement']:.3f} | {v['greedy_identical_continuations']}/{r['prompts']} |"
        for q, v in r["variants"].items())
    return f"""## Quality of quantized weights

`.venv/bin/python -m bench.quality` on {r['versions']['machine']} ({r['versions']['cpu_profile']}): perplexity
on `bench/data/quality.txt` ({r['text_tokens']} tokens) and agreement with the bf16 weights (`none`):
teacher-forced top-1 on that text, and greedy continuations of {r['prompts']} prompts ({r['new_tokens']}
tokens each). The default model's bf16 checkpoint is itself the dequantized Q4_1 GGUF, so `gguf`
(the file's blocks as stored) differs from it only by bf16's rounding of the dequantized weights.

| quantization | perplexity | / bf16 | top-1 agreement | greedy token agreement | identical continuations |
|---|---|---|---|---|---|
{rows}
"""


if __name__ == "__main__":
    main()
