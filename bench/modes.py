"""TorchServe's two ways to run an LLM engine, side by side in one run: continuousBatching (the
frontend drives a decode step or a few per round trip) and asyncCommunication (the worker's own engine
loop, handler/serving/loop_service.py), with the load and weights of bench/peer.py.

    .venv/bin/python -m bench.modes                       # int4 (the default model's GGUF), 1 and 16 clients
    .venv/bin/python -m bench.modes --precision bf16 --concurrency 1 4 16 --requests 8 16 32

Writes docs/results/modes.json (keys `ratio_c<N>` = async / continuous output tok/s,
`ttft_p50_ratio_c<N>` = async / continuous), docs/results/modes.png and a section of
docs/benchmarks.md.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from bench import peer
from bench.common import REPO, RESULTS, versions, write_json, write_section
from handler.engine.convert import ensure_default_checkpoint

MODES = ("continuous", "async")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    # int8 needs llama.cpp's Q8_0 file, which bench/peer.py makes (its --batching compares the modes there)
    p.add_argument("--precision", choices=["bf16", "int4"], default="int4")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    p.add_argument("--requests", type=int, nargs="+", default=[8, 32])
    p.add_argument("--output-tokens", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=16, help="the engine's slots")
    p.add_argument("--max-seq-len", type=int, default=512)
    p.add_argument("--rounds", type=int, default=1, help="measurement rounds per level")
    p.add_argument("--warmup-s", type=float, default=30)
    peer.add_ours_options(p)
    args = p.parse_args()
    if len(args.requests) != len(args.concurrency):
        p.error("--requests needs one count per --concurrency level")
    return args


def main() -> None:
    args = parse_args()
    checkpoint = ensure_default_checkpoint(REPO / "artifacts" / "checkpoints" / "smollm2-135m-instruct")
    gguf = next(checkpoint.glob("*.gguf"))
    runs = {}
    for mode in MODES:
        with tempfile.TemporaryDirectory() as tmp:
            # ours alone (no llama.cpp build: bench.peer compares the peers), in this batching mode
            mode_args = argparse.Namespace(**vars(args), batching=mode, out="modes", systems=["ours"])
            runs[mode] = peer.sweep(args.precision, checkpoint, gguf, {}, {}, mode_args, Path(tmp))["ours"]["runs"]
    result = {"model": "SmolLM2-135M-Instruct", "precision": args.precision, "output_tokens": args.output_tokens,
              "batch_size": args.batch_size, "max_batch_delay_ms": args.max_batch_delay_ms,
              "continuous_call_ms": peer.handler_setting(args.handler_set, "continuous_call_ms"),
              "versions": versions(), **ratios(runs), "runs": runs}
    write_json("modes.json", result)
    plot(result, RESULTS / "modes.png")
    write_section("modes", markdown(result, " ".join(sys.argv[1:])))


def ratios(runs: dict) -> dict:
    out = {}
    cont = {r["concurrency"]: r for r in runs["continuous"]}
    for r in runs["async"]:
        c, base = r["concurrency"], cont[r["concurrency"]]
        out[f"ratio_c{c}"] = r["output_tokens_per_s"] / base["output_tokens_per_s"]
        out[f"ttft_p50_ratio_c{c}"] = r["ttft_p50_s"] / base["ttft_p50_s"] if base["ttft_p50_s"] else None
    return out


def plot(r: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for i, mode in enumerate(MODES):
        xs = [x["concurrency"] for x in r["runs"][mode]]
        axes[0].plot(xs, [x["output_tokens_per_s"] for x in r["runs"][mode]], "o-", color=f"C{i}", label=mode)
        axes[1].plot(xs, [x["ttft_p50_s"] for x in r["runs"][mode]], "o-", color=f"C{i}", label=mode)
    for ax, label in zip(axes, ("output tokens/s", "p50 time to first token (s)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent clients")
        ax.set_ylabel(label)
        ax.legend()
    fig.suptitle(f"continuousBatching vs asyncCommunication, {r['precision']} ({r['versions']['machine']})")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def markdown(r: dict, argv: str) -> str:
    rows = [f"| {mode} | {x['concurrency']} | {x['requests']} | {x['errors']} | {x['output_tokens_per_s']:.1f} | "
            f"{peer.fmt(x['ttft_p50_s'])} / {peer.fmt(x['ttft_p99_s'])} | {peer.fmt(x['itl_p50_s'])} |"
            for mode in MODES for x in r["runs"][mode]]
    ratio_line = ", ".join(f"{c} client(s): {peer.fmt(r[f'ratio_c{c}'])} (TTFT p50 {peer.fmt(r[f'ttft_p50_ratio_c{c}'])})"
                           for c in (x["concurrency"] for x in r["runs"]["async"]))
    v = r["versions"]
    return f"""## Batching modes: continuousBatching vs asyncCommunication

Command: `.venv/bin/python -m bench.modes {argv}`. {v['machine']}, CPU profile {v.get('cpu_profile')}, torch
{v['torch']}. The same .mar settings and load as bench/peer.py ({r['precision']}, {r['batch_size']} slots, streamed
`/v1/completions`, greedy, {r['output_tokens']} tokens, `ignore_eos`), one mode at a time. *continuous*: the
frontend sends every live request back to the worker for each call (a decode step, or a few within
`continuous_call_ms` {r['continuous_call_ms']:g} ms); *async*: the worker's engine loop
(`--batching async`) admits, steps and streams on its own.

| mode | clients | requests | errors | output tok/s | TTFT p50/p99 s | ITL p50 s |
|---|---|---|---|---|---|---|
{chr(10).join(rows)}

async / continuous output tok/s at {ratio_line}.

![modes](results/modes.png)
"""


if __name__ == "__main__":
    main()
