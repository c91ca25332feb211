"""Serving benchmark: a concurrency sweep against this handler and, in the same run, against stock
TorchServe serving the same model through a plain transformers handler.

    .venv/bin/python -m bench.serve
    .venv/bin/python -m bench.serve --cpu-profile avx2   # both systems under a forced (lower) CPU profile

Writes docs/results/serve.json (+ raw per-request records), docs/results/serve.png and the
Serving section of docs/benchmarks.md.

Rows beside the sweep (ours only): the same requests constrained by a JSON schema
(`json_schema_throughput_ratio`), and chat-like traffic whose prompts share a long system prompt,
served with prefix caching off and then on (`prefix_cache_ttft_ratio`, `prefix_cache_throughput_ratio`).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bench.common import REPO, RESULTS, versions, write_json, write_section
from bench.load import PROMPTS, as_rows, run_load, summarize
from handler.engine import platform
from handler.engine.convert import ensure_default_checkpoint
from handler.packing.archive import build_mar
from handler.packing.model_config import ServingOptions
from handler.torchserve.launch import Ports, start_torchserve

# Structured output at the same output length as the free requests: a string of at least 200
# characters cannot close within 32 tokens, so each constrained request also runs to the limit.
SCHEMA_FORMAT = {"type": "json_schema", "json_schema": {"name": "answer", "schema": {
    "type": "object", "properties": {"answer": {"type": "string", "minLength": 200}}, "required": ["answer"]}}}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 64])
    p.add_argument("--requests", type=int, nargs="+", default=[8, 16, 32, 64], help="requests per concurrency level")
    p.add_argument("--output-tokens", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=16, help="TorchServe batchSize for both systems")
    p.add_argument("--baseline-dtype", default="float32", help="float32 is transformers' faster CPU setting here")
    p.add_argument("--systems", nargs="+", default=["ours", "baseline"])
    p.add_argument("--schema-concurrency", type=int, default=16,
                   help="ours: also run this many clients with a response_format JSON schema (0: skip)")
    p.add_argument("--prefix-clients", type=int, default=16,
                   help="ours: this many clients sending prompts that share a system prompt, prefix caching off "
                        "then on (0: skip)")
    p.add_argument("--prefix-tokens", type=int, default=1000, help="tokens of the shared system prompt")
    p.add_argument("--prefix-requests", type=int, default=48)
    p.add_argument("--cpu-profile", metavar="NAME", help="run under this CPU profile (python -m handler.engine.platform); "
                   "the launcher passes it to both TorchServes")
    args = p.parse_args()
    if args.schema_concurrency and args.schema_concurrency not in args.concurrency:
        p.error(f"--schema-concurrency {args.schema_concurrency} must be one of --concurrency "
                f"{args.concurrency}: json_schema_throughput_ratio compares it with the free requests at that level")
    return args


def build_ours(checkpoint: Path, store: Path, args, **handler) -> None:
    handler = {"dtype": "auto", "max_seq_len": 512, "served_model_name": "llm", **handler}
    build_mar(checkpoint, "llm", store, ServingOptions("continuous", args.batch_size, 10, handler=handler))


def build_baseline(checkpoint: Path, store: Path, args) -> None:
    opts = ServingOptions("dynamic", args.batch_size, 50, handler={"dtype": args.baseline_dtype})
    build_mar(checkpoint, "llm", store, opts, handler_file=REPO / "bench" / "baseline_handler.py")


@contextmanager
def serving(store: Path, work: Path, compiled: bool) -> Iterator:
    """TorchServe serving store's llm.mar; with `compiled`, once it runs its compiled steps (ours is
    ready at once and compiles in the background when its compile cache is empty)."""
    ts = start_torchserve(store, {"llm": "llm.mar"}, REPO / "config.properties", work, Ports.free())
    try:
        ts.wait_ready("llm", timeout=1800)
        if compiled:
            ts.wait_compiled("llm", time.monotonic() + 1800)
        yield ts
    finally:
        ts.stop()


def sweep(system: str, checkpoint: Path, args, tmp: Path) -> list[dict]:
    store = tmp / system / "model_store"
    (build_ours if system == "ours" else build_baseline)(checkpoint, store, args)
    runs = []

    def bodies(n: int) -> list[dict]:
        return [{"prompt": PROMPTS[i % len(PROMPTS)], "max_new_tokens": args.output_tokens,
                 **({"ignore_eos": True} if system == "ours" else {})} for i in range(n)]

    with serving(store, tmp / system / "work", compiled=system == "ours") as ts:
        url = f"{ts.inference_url}/predictions/llm"
        run_load(url, ts.headers(), bodies(2), 1, system == "ours")  # warm-up, not recorded
        for conc, n in zip(args.concurrency, args.requests):
            records = run_load(url, ts.headers(), bodies(n), conc, stream=system == "ours")
            summary = {"system": system, "concurrency": conc, **summarize(records)}
            runs.append(summary)
            (RESULTS / "raw").mkdir(parents=True, exist_ok=True)
            (RESULTS / "raw" / f"serve_{system}_c{conc}.json").write_text(json.dumps(as_rows(records)))
            print(f"{system} c={conc}: {summary['output_tokens_per_s']:.1f} tok/s, p99 TTFT {summary['ttft_p99_s']:.2f} s, "
                  f"errors {summary['errors']}", flush=True)
        if system == "ours" and args.schema_concurrency:
            conc = args.schema_concurrency
            with_schema = [{**b, "response_format": SCHEMA_FORMAT} for b in bodies(args.requests[args.concurrency.index(conc)])]
            # Warm-up, not recorded: the first schema builds the grammar engine's tokenizer tables
            # (~0.3 s, once per worker; bench/grammar.py) and compiles the schema.
            run_load(url, ts.headers(), with_schema[:1], 1, stream=True)
            summary = {"system": system, "concurrency": conc, "variant": "json_schema",
                       **summarize(run_load(url, ts.headers(), with_schema, conc, stream=True))}
            runs.append(summary)
            print(f"{system} c={conc} json_schema: {summary['output_tokens_per_s']:.1f} tok/s, errors {summary['errors']}",
                  flush=True)
    return runs


def prefix_runs(checkpoint: Path, args, tmp: Path) -> list[dict]:
    """ours with prompts sharing a system prompt of --prefix-tokens tokens (the fixed text of
    bench/data/quality.txt, repeated to length) and a question each, prefix caching off, then on.
    The warm-up prompt shares nothing: the first requests compute the system prompt's KV."""
    from handler.engine.tokenizer import Tokenizer

    tok = Tokenizer.from_dir(checkpoint)
    text = (REPO / "bench" / "data" / "quality.txt").read_text()
    system = tok.decode(tok.encode(text * (1 + 2 * args.prefix_tokens // len(tok.encode(text))))[: args.prefix_tokens])
    bodies = [{"prompt": f"{system}\n\nQuestion: {PROMPTS[i % len(PROMPTS)]}\nAnswer:", "max_new_tokens": args.output_tokens,
               "ignore_eos": True} for i in range(args.prefix_requests)]
    runs = []
    for caching in (False, True):
        store = tmp / f"prefix-{caching}" / "model_store"
        build_ours(checkpoint, store, args, max_seq_len=args.prefix_tokens + 256, prefix_caching=caching)
        with serving(store, tmp / f"prefix-{caching}" / "work", compiled=True) as ts:
            url = f"{ts.inference_url}/predictions/llm"
            run_load(url, ts.headers(), [{"prompt": PROMPTS[0], "max_new_tokens": 4}], 1, stream=True)  # warm-up
            summary = {"system": "ours", "concurrency": args.prefix_clients, "variant": f"prefix_cache_{'on' if caching else 'off'}",
                       **summarize(run_load(url, ts.headers(), bodies, args.prefix_clients, stream=True))}
        runs.append(summary)
        print(f"ours c={args.prefix_clients} {summary['variant']}: {summary['output_tokens_per_s']:.1f} tok/s, "
              f"p50 TTFT {summary['ttft_p50_s']:.2f} s, errors {summary['errors']}", flush=True)
    return runs


def main() -> None:
    args = parse_args()
    platform.reexec_under(args.cpu_profile)
    checkpoint = ensure_default_checkpoint(REPO / "artifacts" / "checkpoints" / "smollm2-135m-instruct")
    with tempfile.TemporaryDirectory() as tmp:
        runs = [r for system in args.systems for r in sweep(system, checkpoint, args, Path(tmp))]
        if args.prefix_clients and "ours" in args.systems:
            runs += prefix_runs(checkpoint, args, Path(tmp))
    result = {"model": "SmolLM2-135M-Instruct", "output_tokens": args.output_tokens, "prompt_tokens": mean_prompt_tokens(checkpoint),
              "versions": versions(), "batch_size": args.batch_size, "baseline_dtype": args.baseline_dtype, "runs": runs}
    by = {(r["system"], r["concurrency"]): r for r in runs if "variant" not in r}
    schema_run = next((r for r in runs if r.get("variant") == "json_schema"), None)
    if schema_run is not None:
        result["json_schema_throughput_ratio"] = (schema_run["output_tokens_per_s"]
                                                  / by["ours", schema_run["concurrency"]]["output_tokens_per_s"])
    variants = {r["variant"]: r for r in runs if "variant" in r}
    if "prefix_cache_on" in variants:
        on, off = variants["prefix_cache_on"], variants["prefix_cache_off"]
        result["prefix_cache_system_tokens"] = args.prefix_tokens
        result["prefix_cache_ttft_ratio"] = on["ttft_p50_s"] / off["ttft_p50_s"]
        result["prefix_cache_throughput_ratio"] = on["output_tokens_per_s"] / off["output_tokens_per_s"]
    if ("ours", 16) in by and ("baseline", 16) in by:
        result["throughput_ratio_vs_baseline_c16"] = by["ours", 16]["output_tokens_per_s"] / by["baseline", 16]["output_tokens_per_s"]
        result["p99_ttft_ratio_vs_baseline_c16"] = by["ours", 16]["ttft_p99_s"] / by["baseline", 16]["ttft_p99_s"]
    write_json("serve.json", result)
    plot(result, RESULTS / "serve.png")
    write_section("serve", markdown(result, " ".join(sys.argv[1:])))


def mean_prompt_tokens(checkpoint: Path) -> int:
    from handler.engine.tokenizer import Tokenizer

    tok = Tokenizer.from_dir(checkpoint)
    return round(sum(len(tok.encode(p)) for p in PROMPTS) / len(PROMPTS))


def plot(r: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for system in ("ours", "baseline"):
        runs = [x for x in r["runs"] if x["system"] == system and "variant" not in x]
        if runs:
            axes[0].plot([x["concurrency"] for x in runs], [x["output_tokens_per_s"] for x in runs], "o-", label=system)
            axes[1].plot([x["concurrency"] for x in runs], [x["ttft_p99_s"] for x in runs], "o-", label=system)
    for ax, label in zip(axes, ("output tokens/s", "p99 time to first token (s)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent clients")
        ax.set_ylabel(label)
        ax.legend()
    axes[1].set_yscale("log")
    fig.suptitle(f"TorchServe serving SmolLM2-135M, {r['output_tokens']} output tokens per request", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _fmt(value: float | None, scale: float = 1, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value * scale:.{digits}f}"


def markdown(r: dict, argv: str) -> str:
    rows = "\n".join(
        f"| {x['system']}{' (' + x['variant'] + ')' if 'variant' in x else ''} | {x['concurrency']} | {x['requests']} | "
        f"{x['errors']} | {x['request_throughput']:.2f} | "
        f"{x['output_tokens_per_s']:.1f} | {_fmt(x['ttft_p50_s'])} / {_fmt(x['ttft_p99_s'])} | "
        f"{_fmt(x['itl_p50_s'], 1000, 0)} / {_fmt(x['itl_p99_s'], 1000, 0)} | {_fmt(x['e2e_p50_s'])} / {_fmt(x['e2e_p99_s'])} |"
        for x in r["runs"])
    v = r["versions"]
    ratio = ""
    if "throughput_ratio_vs_baseline_c16" in r:
        ratio = (f"At 16 clients: **{r['throughput_ratio_vs_baseline_c16']:.1f}x** the baseline's output tokens/s, p99 TTFT "
                 f"ratio **{r['p99_ttft_ratio_vs_baseline_c16']:.3f}** (ours / baseline).")
    if "json_schema_throughput_ratio" in r:
        ratio += (f"\n\n*ours (json_schema)*: the same requests with a `response_format` JSON schema whose string cannot "
                  f"close within {r['output_tokens']} tokens (so they run as long as the free ones), decoded under "
                  f"llguidance's per-token mask: `json_schema_throughput_ratio` = **{r['json_schema_throughput_ratio']:.2f}** "
                  "the free requests' output tok/s at the same concurrency (target >= 0.8).")
    if "prefix_cache_ttft_ratio" in r:
        ratio += (f"\n\n*ours (prefix_cache_off / _on)*: prompts of a {r['prefix_cache_system_tokens']}-token shared system "
                  "prompt and a question each, served with `prefix_caching: false`, then `true` (the default): "
                  f"`prefix_cache_ttft_ratio` = **{r['prefix_cache_ttft_ratio']:.3f}** (p50 TTFT, on / off; target <= 0.3), "
                  f"`prefix_cache_throughput_ratio` = **{r['prefix_cache_throughput_ratio']:.2f}** (output tok/s, on / off; "
                  "target >= 1.5).")
    return f"""## Serving (TorchServe, concurrency sweep)

Command: `.venv/bin/python -m bench.serve {argv}`. Versions: torch {v['torch']}, torchserve {v.get('torchserve')},
transformers {v.get('transformers')}, {v['machine']}, CPU profile {v.get('cpu_profile')}. Each request asks for \
{r['output_tokens']} tokens (ours with
`ignore_eos`, the baseline with `min_new_tokens`), prompts of 10-15 words; a fixed request count per level.
*ours*: this handler, continuousBatching, batchSize {r['batch_size']}, compiled, bf16, streaming (TTFT = first
chunk). *baseline*: stock TorchServe + a plain transformers handler (`bench/baseline_handler.py`): eager `generate`,
{r['baseline_dtype']} (transformers' faster CPU dtype here), batchSize {r['batch_size']}, maxBatchDelay 50 ms, no
streaming, so its TTFT is its end-to-end latency and it has no inter-token latency.

| system | clients | requests | errors | req/s | output tok/s | TTFT p50/p99 s | ITL p50/p99 ms | e2e p50/p99 s |
|---|---|---|---|---|---|---|---|---|
{rows}

{ratio}

![serve](results/serve.png)
"""


if __name__ == "__main__":
    main()
