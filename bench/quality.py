"""Faithfulness (issue 61): how close each served path stays to the unrounded model of the same
file, beside llama.cpp on that file.

    .venv/bin/python -m bench.quality                        # every path
    .venv/bin/python -m bench.quality --paths default q4_0   # some of them

The paths are GGUF files: the default model as shipped (`default`: Q4_1 projections, a Q8_0 head),
its Q4_0, Q4_K_M, Q8_0 and BF16 files made by llama-quantize (bench/peer_llamacpp.py), and the real
Gemma 3 270M Q4_K_M file (`gemma3_q4_k_m`). For each file, on the same positions of the same text
(bench/data/perplexity.txt, llama-perplexity's chunks of --ctx tokens, each chunk's second half
scored, every chunk starting with BOS):
- the reference: the file's weights dequantized, float32 activations and KV cache, never rounded
  (eager engine, `quantization: none`, `dtype: float32`);
- ours: the path a worker serves the file on (`quantization: auto`, `dtype: auto`, the default
  `activations`), eager steps, which call the same kernels as the compiled ones;
- llama.cpp: `llama-perplexity` on the file, its log-probabilities saved (--kl-divergence-base,
  16-bit codes over a window of e^16) and read here: its own defaults (8-bit activations in the
  quantized products, float16 KV cache).
Measured against the reference: top-1 agreement (the same most likely next token; for llama.cpp a
tie at its 16-bit resolution counts as agreement), mean KL divergence KL(reference || path), and
perplexity over the reference's. Writes docs/results/quality.json and the Quality section of
docs/benchmarks.md.
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from bench import peer_llamacpp as llamacpp
from bench.common import versions, write_json, write_section
from bench.gguf_files import gemma_file
from bench.llamacpp_logits import TEXT, Saved, chunk_logits, first_token, llama_perplexity
from handler.engine.config import EngineConfig
from handler.engine.factory import build_engine
from handler.packing.gguf_checkpoint import stage_gguf

DEFAULT_TYPES = {"default": llamacpp.SHIPPED, "q4_0": "Q4_0", "q4_k_m": "Q4_K_M", "q8_0": "Q8_0", "bf16": "BF16"}
PATHS = (*DEFAULT_TYPES, "gemma3_q4_k_m")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--paths", nargs="+", choices=PATHS, default=list(PATHS))
    p.add_argument("--ctx", type=int, default=512, help="llama-perplexity's chunk length (its default)")
    return p.parse_args()


def log_probs(cfg: EngineConfig, saved: Saved, bos: int | None) -> tuple[list[torch.Tensor], str]:
    """Per chunk, the engine's log-softmax [scored, V] at llama-perplexity's scored positions; its path."""
    loaded = build_engine(cfg)
    return [F.log_softmax(logits, -1) for logits in chunk_logits(loaded.model, saved, bos)], loaded.path


def against(reference: list[torch.Tensor], path: list[torch.Tensor], saved: Saved, ties: bool) -> dict:
    """Top-1 agreement, mean KL(reference || path) in nats, and perplexity over the reference's, on the
    scored positions. `ties`: the path is llama.cpp's, whose equal 16-bit codes tie for the top."""
    agree = kl = nll = nll_ref = 0.0
    total = 0
    for chunk, (ref, got) in enumerate(zip(reference, path, strict=True)):
        targets, best = saved.targets(chunk)[:, None], ref.argmax(-1)
        agree += float((saved.is_top(chunk, best) if ties else got.argmax(-1) == best).sum())
        kl += float((ref.exp() * (ref - got)).sum())
        nll -= float(got.gather(1, targets).sum())
        nll_ref -= float(ref.gather(1, targets).sum())
        total += len(targets)
    return {"top1": round(agree / total, 4), "kl": float(f"{kl / total:.3g}"),
            "ppl_ratio": round(float(np.exp((nll - nll_ref) / total)), 4), "reference_nll": nll_ref / total,
            "positions": total}


def measure(gguf: Path, build: dict, ctx: int, tmp: Path) -> dict:
    print(gguf.name, flush=True)
    reported, saved_path = llama_perplexity(build, gguf, ctx, tmp)
    saved, bos = Saved(saved_path), first_token(gguf)
    ckpt = stage_gguf(gguf, tmp / gguf.stem)
    common: dict[str, Any] = {"checkpoint_dir": ckpt, "compile": "eager", "max_batch_size": 1, "max_seq_len": saved.n_ctx}
    reference, reference_path = log_probs(EngineConfig(**common, quantization="none", dtype="float32"), saved, bos)
    ours, path = log_probs(EngineConfig(**common), saved, bos)
    theirs = [saved.log_probs(chunk) for chunk in range(len(saved.tokens))]
    mine, llama = against(reference, ours, saved, ties=False), against(reference, theirs, saved, ties=True)
    row = {"file": gguf.name, "engine_path": path, "reference_path": reference_path, "positions": mine["positions"],
           "reference_perplexity": round(float(np.exp(mine["reference_nll"])), 4),
           "top1_vs_reference": mine["top1"], "kl_vs_reference": mine["kl"], "ppl_ratio_vs_reference": mine["ppl_ratio"],
           "llamacpp_top1_vs_reference": llama["top1"], "llamacpp_kl_vs_reference": llama["kl"],
           "llamacpp_ppl_ratio_vs_reference": llama["ppl_ratio"], "llamacpp_perplexity_reported": reported}
    print(f"  {row}", flush=True)
    return row


def files(build: dict, paths: list[str]) -> dict[str, Path]:
    """{path: GGUF file}: the default model's (made once, cached), the Gemma file (downloaded once)."""
    found = {p: llamacpp.default_ggufs(build, [DEFAULT_TYPES[p]])[DEFAULT_TYPES[p]] for p in paths if p in DEFAULT_TYPES}
    if "gemma3_q4_k_m" in paths:
        found["gemma3_q4_k_m"] = gemma_file()
    return found


def main() -> None:
    args = parse_args()
    build = llamacpp.ensure_built(torch.get_num_threads())
    with tempfile.TemporaryDirectory() as tmp:
        paths = {p: measure(f, build, args.ctx, Path(tmp)) for p, f in files(build, args.paths).items()}
    result = {"versions": versions(), "text": TEXT.name, "ctx": args.ctx, "activations": EngineConfig.activations,
              "llamacpp": build["version_line"], "paths": paths}
    write_json("quality.json", result)
    write_section("quality", markdown(result))


def markdown(r: dict) -> str:
    rows = "\n".join(
        f"| {p} | {v['file']} | {v['top1_vs_reference']:.4f} | {v['llamacpp_top1_vs_reference']:.4f} | "
        f"{v['kl_vs_reference']:.2g} | {v['llamacpp_kl_vs_reference']:.2g} | {v['ppl_ratio_vs_reference']:.4f} | "
        f"{v['llamacpp_ppl_ratio_vs_reference']:.4f} |" for p, v in r["paths"].items())
    return f"""## Faithfulness to the unrounded model (issue 61)

`.venv/bin/python -m bench.quality` on {r['versions']['machine']} ({r['versions']['cpu_profile']}): each GGUF
file against its own weights dequantized with float32 activations and KV cache (the reference), ours
(the path a worker serves the file on, `activations: {r['activations']}`; eager steps, which call the
same kernels as the compiled ones) beside llama.cpp
(`llama-perplexity`, its defaults: 8-bit activations, float16 KV), on the same
{next(iter(r['paths'].values()))['positions'] if r['paths'] else 0} scored positions of
`bench/data/{r['text']}` (chunks of {r['ctx']} tokens, the second half of each scored). Top-1: the same
most likely next token as the reference; KL: mean KL(reference || path) in nats (llama.cpp's from its
16-bit log-probabilities, whose rounding alone is worth about 1e-4: a value near 0 can come out
negative); perplexity over the reference's.

| path | file | top-1, ours | top-1, llama.cpp | KL, ours | KL, llama.cpp | ppl ratio, ours | ppl ratio, llama.cpp |
|---|---|---|---|---|---|---|---|
{rows}
"""


if __name__ == "__main__":
    main()
