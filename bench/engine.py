"""Engine benchmark: decode tokens/s of transformers `generate` (eager) vs this engine (eager and
compiled), at several batch sizes, in one process, plus the memory-bandwidth roofline at batch 1.

    .venv/bin/python -m bench.engine                      # CPU, this CPU's auto path, batches 1 8 32
    .venv/bin/python -m bench.engine --cpu-profile avx2   # the same under a forced (lower) CPU profile
    .venv/bin/python -m bench.engine --device cuda        # the same on a GPU (see bench/gpu.sh)

Writes docs/results/engine.json (the run, plus `profiles`: the headline numbers of the latest
run under each CPU profile, this one's replaced), docs/results/engine.png and the Engine section
of docs/benchmarks.md.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import torch

from bench.common import RESULTS, best_seconds, previous_profiles, sync, versions, write_json, write_section
from handler.engine import platform
from handler.engine.config import EngineConfig
from handler.engine.convert import ensure_default_checkpoint
from handler.engine.factory import build_engine
from handler.engine.sampling import SamplingParams
from handler.engine.tokenizer import Tokenizer

PROMPT = "The history of the printing press begins in"


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", type=Path, default=None, help="default: the converted SmolLM2-135M-Instruct")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"],
                   help="weights of both transformers and this engine")
    p.add_argument("--cpu-profile", metavar="NAME", help="run under this CPU profile (python -m handler.engine.platform)")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--variants", nargs="+", default=list(VARIANTS))
    p.add_argument("--out", default="engine")
    return p.parse_args()


def memory_bandwidth(device: str) -> float:
    """Read bandwidth in bytes/s: best of 10 sums over 256 MiB."""
    x = torch.ones(64 * 2**20, dtype=torch.float32, device=device)
    return x.numel() * 4 / best_seconds(x.sum, device, 10)


def peak_matmul_flops(device: str, dtype: torch.dtype) -> float:
    """Matmul throughput in FLOP/s: best of 5 square 2048 products in the serving dtype (after
    one that warms up the BLAS). Decode at large batch is bound by it: every token costs 2 FLOPs
    per weight."""
    a = torch.randn(2048, 2048, dtype=dtype, device=device)
    return 2 * 2048**3 / best_seconds(lambda: a @ a, device, 6)


def _compute_dtype(device: str, dtype: platform.Dtype) -> str:
    if not device.startswith("cpu"):
        return dtype
    packing = platform.choose_path(platform.current(), "cpu", dtype, "auto").packed
    return dtype if packing == "off" else packing


def weight_bytes_per_token(model) -> int:
    """Bytes a batch-1 decode step must read: every weight once (the embedding table is only
    gathered, but with tied embeddings it is read whole as the output projection)."""
    params = model.named_parameters(remove_duplicate=False)  # a tied output head shares the embedding tensor
    quantized = [b for n, b in model.named_buffers() if n.rsplit(".", 1)[-1] in ("q", "d", "m")]  # quantized projections
    return (sum(p.numel() * p.element_size() for n, p in params if not n.startswith("tok_embeddings"))
            + sum(b.numel() * b.element_size() for b in quantized))


def matmul_weights(model) -> int:
    """Multiply-adds per token in the projections and the head."""
    return sum(m.in_features * m.out_features for m in model.modules() if isinstance(m, torch.nn.Linear))


REPEATS = 3  # every speed is the best of this many runs, for transformers and this engine alike


def hf_decode_tps(checkpoint: Path, device: str, dtype: torch.dtype, batch: int, n: int) -> float:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(checkpoint)
    # transformers' own decorator hides PreTrainedModel.to's signature from mypy
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=dtype).to(device).eval()  # type: ignore[arg-type]
    ids = tok([PROMPT] * batch, return_tensors="pt").input_ids.to(device)

    def run(new: int) -> float:
        sync(device)
        t = time.perf_counter()
        with torch.inference_mode():
            model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=tok.eos_token_id)
        sync(device)
        return time.perf_counter() - t

    run(2)  # warm-up
    # Decode time = generate(n) - generate(1): the first token comes from the prefill.
    return max(batch * (n - 1) / max(run(n) - run(1), 1e-9) for _ in range(REPEATS))


def ours_decode_tps(engine, device: str, batch: int, n: int) -> float:
    return max(_ours_decode_tps(engine, device, batch, n) for _ in range(REPEATS))


def _ours_decode_tps(engine, device: str, batch: int, n: int) -> float:
    ids = engine.tokenizer.encode(PROMPT)
    params = SamplingParams(max_new_tokens=n + 1, ignore_eos=True)
    for i in range(batch):
        engine.add(f"r{i}", ids, params)
    engine.step()  # prefill: every sequence gets its first token
    engine.step()  # first decode at this batch size (warm)
    sync(device)
    t = time.perf_counter()
    steps = 0
    while engine.running:
        engine.step()
        steps += 1
    sync(device)
    return batch * steps / (time.perf_counter() - t)


VARIANTS: dict[str, dict[str, Any]] = {
    "eager": dict(compile="eager", quantization="none"),
    "compiled": dict(compile="inductor", quantization="none"),  # AOT-compiled graphs, weights as inputs
    # weight-only quantized projections (handler.engine.quant): round-to-nearest from the bf16
    # weights, and the checkpoint's GGUF as stored (the default model: Q4_1, head Q8_0)
    "compiled_int8": dict(compile="inductor", quantization="int8"),
    "compiled_int4": dict(compile="inductor", quantization="int4"),
    "compiled_gguf": dict(compile="inductor", quantization="gguf"),
    # torch.compile with weights frozen + prepacked and max-autotune GEMMs: fastest decode, but a
    # frozen graph cannot be saved as an AOT artifact, so it compiles at every start.
    "compiled_autotune": dict(compile="inductor", freezing=True, max_autotune=True, quantization="none"),
}


def main() -> None:
    args = parse_args()
    platform.reexec_under(args.cpu_profile)
    checkpoint = args.checkpoint or ensure_default_checkpoint(Path("artifacts/checkpoints/smollm2-135m-instruct"))
    dtype = getattr(torch, args.dtype)
    result = {"versions": versions(), "device": args.device, "dtype": args.dtype, "new_tokens": args.new_tokens,
              "batches": args.batches, "tokens_per_s": {}, "compile_seconds": {}}
    result["prompt_tokens"] = len(Tokenizer.from_dir(checkpoint).encode(PROMPT))
    bw = memory_bandwidth(args.device)
    result["memory_bandwidth_gb_s"] = bw / 1e9
    # The matmul dtype of several-row calls: the packed copy's where there is one (float32 on
    # AVX2, whose bf16 GEMM runs at a few GFLOP/s), else the weights'.
    compute = _compute_dtype(args.device, args.dtype)
    flops = peak_matmul_flops(args.device, getattr(torch, compute))
    result["peak_matmul_gflops"], result["peak_matmul_dtype"] = flops / 1e9, compute
    for batch in args.batches:
        tps = hf_decode_tps(checkpoint, args.device, dtype, batch, args.new_tokens)
        result["tokens_per_s"].setdefault("hf_eager", {})[str(batch)] = tps
        print(f"hf_eager bs={batch}: {tps:.1f} tok/s", flush=True)
    max_batch = max(args.batches)
    for name in args.variants:
        # Every prompt prefilled in the first step (one chunk for all; the prompts are the same,
        # and prefix caching would make the others wait for the first): decode is measured.
        cfg = EngineConfig(checkpoint, dtype=args.dtype, device=args.device, max_batch_size=max_batch, max_seq_len=256,
                           prefill_chunk=max_batch * 256, prefix_caching=False, **VARIANTS[name])
        loaded = build_engine(cfg)
        result["compile_seconds"][name] = loaded.steps.compile_seconds
        if name == args.variants[0]:
            result["engine_path"] = loaded.path
            weight_bytes = weight_bytes_per_token(loaded.model)
            result["weight_bytes_per_token"] = weight_bytes
            result["roofline_tokens_per_s_bs1"] = bw / weight_bytes
            # tokens/s no batch size can beat: matmuls alone at the measured peak
            result["compute_roofline_tokens_per_s"] = flops / (2 * matmul_weights(loaded.model))
        result.setdefault("weight_bytes_per_token_by_variant", {})[name] = weight_bytes_per_token(loaded.model)
        for batch in args.batches:
            tps = ours_decode_tps(loaded.engine, args.device, batch, args.new_tokens)
            result["tokens_per_s"].setdefault(name, {})[str(batch)] = tps
            print(f"{name} bs={batch}: {tps:.1f} tok/s (compile {loaded.steps.compile_seconds:.0f} s)", flush=True)
        del loaded
        torch._dynamo.reset()
    summarize(result)
    result["profiles"] = with_profile(RESULTS / f"{args.out}.json", result)
    write_json(f"{args.out}.json", result)
    plot(result, RESULTS / f"{args.out}.png")
    write_section(args.out, markdown(result, " ".join(sys.argv[1:]), args.out))


def summarize(r: dict) -> None:
    tps = r["tokens_per_s"]
    compiled = [v for v in tps if v.startswith("compiled")]
    best = max(compiled, key=lambda v: tps[v][str(r["batches"][0])]) if compiled else "eager"
    r["headline_variant"] = best
    first, last = str(r["batches"][0]), str(r["batches"][-1])
    r[f"speedup_vs_hf_bs{first}"] = tps[best][first] / tps["hf_eager"][first]
    r[f"speedup_vs_hf_bs{last}"] = tps[max(compiled, key=lambda v: tps[v][last]) if compiled else best][last] / tps["hf_eager"][last]
    # against the bandwidth roofline of the headline's own weights (quantized ones are fewer bytes)
    own_bytes = r.get("weight_bytes_per_token_by_variant", {}).get(best, r["weight_bytes_per_token"])
    r["roofline_fraction_bs1"] = tps[best].get("1", 0.0) / (r["memory_bandwidth_gb_s"] * 1e9 / own_bytes)


HEADLINE_KEYS = ("headline_variant", "memory_bandwidth_gb_s", "roofline_tokens_per_s_bs1")


def with_profile(previous_file: Path, r: dict) -> dict:
    """The `profiles` of the previous results with this run's headline under its CPU profile."""
    profiles = previous_profiles(previous_file)
    speedups = {k: v for k, v in r.items() if k.startswith(("speedup_vs_hf_bs", "roofline_fraction"))}
    profiles[r["versions"]["cpu_profile"]] = {
        **speedups, **{k: r[k] for k in HEADLINE_KEYS}, "tokens_per_s": r["tokens_per_s"], "dtype": r["dtype"],
        "engine_path": r.get("engine_path"), "machine": r["versions"]["machine"], "forced": r["versions"]["cpu_profile_forced"],
        "date": time.strftime("%Y-%m-%d")}
    return profiles


def plot(r: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    variants = list(r["tokens_per_s"])
    batches = [str(b) for b in r["batches"]]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    width = 0.8 / len(variants)
    for i, v in enumerate(variants):
        xs = [j + i * width for j in range(len(batches))]
        ax.bar(xs, [r["tokens_per_s"][v][b] for b in batches], width, label=v)
    ax.axhline(r["roofline_tokens_per_s_bs1"], color="k", ls="--", lw=1, label="bs1 bandwidth roofline")
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(batches))], [f"batch {b}" for b in batches])
    ax.set_yscale("log")
    ax.set_ylabel("decode tokens/s (log)")
    ax.set_title(f"SmolLM2-135M decode, {r['dtype']}, {r['device']} ({r['versions']['machine']})", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def markdown(r: dict, argv: str, out: str) -> str:
    tps = r["tokens_per_s"]
    rows = "\n".join(f"| {v} | " + " | ".join(f"{tps[v][str(b)]:.1f}" for b in r["batches"]) +
                     f" | {r['compile_seconds'].get(v, 0):.0f} |" for v in tps)
    v = r["versions"]
    first, last = r["batches"][0], r["batches"][-1]
    return f"""## Engine (decode tokens/s, {r['dtype']}, {r['device']})

Command: `.venv/bin/python -m bench.engine {argv}`. Versions: torch {v['torch']}, transformers {v.get('transformers')},
Python {v['python']}, {v['machine']}, CPU profile {v.get('cpu_profile')} (engine path `{r.get('engine_path')}`), \
{v['threads']} threads. {r['new_tokens']} new tokens per sequence, greedy,
prompt of {r['prompt_tokens']} tokens; decode time excludes the prefill; each number is the best of {REPEATS} runs. \
`hf_eager` is transformers `generate` in the same dtype.

| variant | """ + " | ".join(f"batch {b}" for b in r["batches"]) + " | compile s |\n|---|" + "---|" * (len(r["batches"]) + 1) + f"""
{rows}

- Measured read bandwidth {r['memory_bandwidth_gb_s']:.1f} GB/s; {r['weight_bytes_per_token'] / 1e6:.0f} MB of weights per
  batch-1 step, so the roofline is {r['roofline_tokens_per_s_bs1']:.0f} tokens/s.
- Measured {r.get('peak_matmul_dtype', r['dtype'])} matmul peak {r['peak_matmul_gflops']:.0f} GFLOP/s (2048x2048 \
products): at 2 FLOPs per weight per
  token, no batch size decodes faster than {r['compute_roofline_tokens_per_s']:.0f} tokens/s on this machine (the compute roofline;
  transformers at batch {last} reaches {tps['hf_eager'][str(last)] / r['compute_roofline_tokens_per_s']:.0%} of it, so \
4x transformers would be
  {4 * tps['hf_eager'][str(last)] / r['compute_roofline_tokens_per_s']:.0%} of it).
- Headline ({r['headline_variant']}): **{r[f'speedup_vs_hf_bs{first}']:.2f}x** transformers at batch {first},
  **{r[f'speedup_vs_hf_bs{last}']:.2f}x** at batch {last}, **{100 * r['roofline_fraction_bs1']:.0f}%** of the batch-1 roofline of its own
  weights' bytes (per variant, MB per batch-1 step: \
{', '.join(f"{k} {b / 1e6:.0f}" for k, b in r.get('weight_bytes_per_token_by_variant', {}).items())}).

![engine](results/{out}.png)

Latest headline per CPU profile (`profiles` in results/{out}.json; each row from its own run, transformers
measured in the same run under the same profile):

| CPU profile | machine | date | engine path | vs transformers, batch 1 | vs transformers, largest batch | batch-1 roofline |
|---|---|---|---|---|---|---|
""" + "\n".join(_profile_row(name, p) for name, p in sorted(r.get("profiles", {}).items())) + "\n"


def _profile_row(name: str, p: dict) -> str:
    largest = max((k for k in p if k.startswith("speedup_vs_hf_bs") and k != "speedup_vs_hf_bs1"),
                  key=lambda k: int(k.removeprefix("speedup_vs_hf_bs")), default=None)
    forced = " (forced)" if p.get("forced") else ""
    at_largest = f"{p[largest]:.2f}x (bs{largest.removeprefix('speedup_vs_hf_bs')})" if largest else "-"
    return (f"| {name}{forced} | {p.get('machine')} | {p.get('date')} | `{p.get('engine_path')}` | "
            f"{p.get('speedup_vs_hf_bs1', 0):.2f}x | {at_largest} | {100 * p.get('roofline_fraction_bs1', 0):.0f}% |")


if __name__ == "__main__":
    main()
