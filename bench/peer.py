"""Side by side with llama.cpp: this handler and `llama-server` serving the same weights (the default
model's Q4_1 GGUF; BF16 and Q8_0 requantized from it) at each precision, the same streaming load
against both systems' /v1/completions, one system at a time.

    .venv/bin/python bench/peer.py                        # every precision: bf16, int8, int4
    .venv/bin/python bench/peer.py --precisions int4      # one pair
    .venv/bin/python bench/peer.py --build-only           # build llama.cpp (once, cached) and stop

Pairs serve the same file on both sides: ours `quantization: none` (the bf16 checkpoint, which is
the Q4_1 file dequantized) with llama.cpp BF16; ours `quantization: gguf` with the Q8_0 file
beside the checkpoint with llama.cpp Q8_0, and with the Q4_1 file with llama.cpp Q4_1. llama.cpp is built once from the tree vendored in the llama-cpp-python sdist (see
bench/peer_llamacpp.py; 15-40 minutes on 2 cores) and cached with the GGUFs under
$XDG_CACHE_HOME/ts-llm/llama.cpp. Writes docs/results/peer.json (+ raw per-request records),
docs/results/peer.png and the llama.cpp section of docs/benchmarks.md.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]  # this checkout's handler
import peer_llamacpp as llamacpp  # noqa: E402
from common import REPO, RESULTS, versions, write_json, write_section  # noqa: E402
from loadgen import raw, run_load, summarize  # noqa: E402
from serve import PROMPTS  # noqa: E402

from handler.build.archive import build_mar  # noqa: E402
from handler.build.model_config import ServingOptions, handler_config  # noqa: E402
from handler.engine import platform  # noqa: E402
from handler.engine.convert import ensure_default_checkpoint  # noqa: E402
from handler.serving.config import HandlerConfig  # noqa: E402
from handler.torchserve.launch import Ports, free_port, start_torchserve  # noqa: E402
from handler.typed_config import flag  # noqa: E402

PRECISIONS = {"bf16": "none", "int8": "gguf", "int4": "gguf"}  # ours' handler `quantization` per precision
SYSTEMS = ("ours", "llama.cpp")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--precisions", nargs="+", choices=list(PRECISIONS), default=list(PRECISIONS))
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 64])
    p.add_argument("--requests", type=int, nargs="+", default=[32, 32, 64, 64],
                   help="requests per concurrency level (32 at one client: a few slow requests on a shared host move 8 a lot)")
    p.add_argument("--output-tokens", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=16, help="ours' batchSize and llama-server's -np (parallel slots)")
    p.add_argument("--batching", choices=["continuous", "async"], default="continuous",
                   help="ours' batching mode (bench/modes.py compares them)")
    p.add_argument("--max-seq-len", type=int, default=512, help="ours' max_seq_len")
    add_ours_options(p)
    p.add_argument("--ctx", type=int, default=16384, help="llama-server's -c (shared by its slots)")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="llama-server's -t/-tb; build jobs")
    p.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    p.add_argument("--cpu-profile", metavar="NAME", help="run under this CPU profile: ours forced to it, llama.cpp "
                   "built for it (avx2: explicit AVX2 flags, a build of its own)")
    p.add_argument("--build-only", action="store_true", help="build llama.cpp (cached) and stop")
    p.add_argument("--out", default="peer", help="results name: docs/results/<out>.json and .png, the <out> section of "
                   "docs/benchmarks.md (another name keeps a run of some precisions beside the full one)")
    args = p.parse_args()
    if len(args.requests) != len(args.concurrency):
        p.error("--requests needs one count per --concurrency level")
    return args


def add_ours_options(p: argparse.ArgumentParser) -> None:
    """What sweep_ours reads beyond the load's own options (bench/modes.py shares them)."""
    p.add_argument("--max-batch-delay-ms", **flag(ServingOptions, "max_batch_delay_ms"), help="ours' maxBatchDelay")
    p.add_argument("--handler-set", metavar="KEY=VALUE", action="append", default=[],
                   help="another key of ours' handler: section (a YAML value), e.g. continuous_call_ms=0; repeatable")


def handler_settings(pairs: list[str]) -> dict:
    """["continuous_call_ms=0"] -> {"continuous_call_ms": 0}; the values read as YAML."""
    settings = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"--handler-set wants KEY=VALUE, got {pair!r}")
        settings[key] = yaml.safe_load(value)
    return settings


def continuous_call_ms(handler_set: list[str]) -> float:
    """What ours' continuous calls were given (the handler's default unless --handler-set says)."""
    return handler_settings(handler_set).get("continuous_call_ms", HandlerConfig.continuous_call_ms)


def bodies(n: int, args, system: str) -> list[dict]:
    """The same OpenAI completions requests for both: greedy, exactly output_tokens (ignore_eos)."""
    extra = {"cache_prompt": False} if system == "llama.cpp" else {}  # ours keeps no prompt cache either
    return [{"prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": args.output_tokens, "temperature": 0,
             "ignore_eos": True, "stream_options": {"include_usage": True}, **extra} for i in range(n)]


def measure(system: str, precision: str, url: str, headers: dict, args) -> list[dict]:
    # A connection per request, for both: llama-server closes idle keep-alive connections, and a POST
    # sent on one it just closed fails (RemoteDisconnected) without ever reaching it.
    headers = {**headers, "Connection": "close"}
    run_load(url, headers, bodies(2, args, system), 1, stream=True)  # warm-up, not recorded
    runs = []
    for conc, n in zip(args.concurrency, args.requests):
        records = run_load(url, headers, bodies(n, args, system), conc, stream=True)
        summary = {"concurrency": conc, **summarize(records)}
        summary["tokens_per_request"] = summary["output_tokens"] / max(summary["requests"] - summary["errors"], 1)
        runs.append(summary)
        (RESULTS / "raw").mkdir(parents=True, exist_ok=True)
        (RESULTS / "raw" / f"peer_{system}_{precision}_c{conc}.json").write_text(json.dumps(raw(records)))
        print(f"{system} {precision} c={conc}: {summary['output_tokens_per_s']:.1f} tok/s, p99 TTFT "
              f"{_fmt(summary['ttft_p99_s'])} s, {summary['tokens_per_request']:.1f} tokens/request, "
              f"errors {summary['errors']}", flush=True)
    return runs


def ours_checkpoint(precision: str, checkpoint: Path, gguf: Path, tmp: Path) -> Path:
    """The default checkpoint with the pair's GGUF beside it (linked, not copied): under
    quantization: gguf ours serves exactly llama.cpp's file."""
    out = tmp / f"checkpoint-{precision}"
    out.mkdir()
    for f in checkpoint.iterdir():
        if f.is_file() and f.suffix != ".gguf":
            os.link(f, out / f.name)
    if PRECISIONS[precision] == "gguf":
        os.link(gguf, out / gguf.name)
    return out


def sweep_ours(precision: str, checkpoint: Path, gguf: Path, args, tmp: Path) -> dict:
    handler = {"dtype": "auto", "max_seq_len": args.max_seq_len, "served_model_name": "llm",
               "quantization": PRECISIONS[precision], **handler_settings(args.handler_set)}
    opts = ServingOptions(args.batching, args.batch_size, args.max_batch_delay_ms, handler=handler)
    checkpoint = ours_checkpoint(precision, checkpoint, gguf, tmp)
    handler_config(opts, checkpoint)  # a refused option fails here, in a second, not in a worker
    run_dir = tmp / f"ours-{precision}-{args.batching}"
    build_mar(checkpoint, "llm", run_dir / "model_store", opts)
    ts = start_torchserve(run_dir / "model_store", {"llm": "llm.mar"}, REPO / "config.properties", run_dir / "work",
                          Ports.free())
    try:
        ts.wait_ready("llm", timeout=1800)
        ts.wait_compiled("llm", time.monotonic() + 1800)  # ready at once; measured once compiled
        url = f"{ts.inference_url}/predictions/llm/1.0/v1/completions"
        runs = measure("ours", precision, url, ts.headers(), args)
    finally:
        ts.stop()
    return {"batching": args.batching, "handler": opts.handler, "gguf": gguf.name if PRECISIONS[precision] == "gguf" else None, "runs": runs}


def sweep_llamacpp(precision: str, build: dict, gguf: Path, args, tmp: Path) -> dict:
    server, note = start_llamacpp(precision, build, gguf, args, tmp), None
    if server is None:
        # Seen on Sapphire Rapids (2-core VM): every Q8_0 / Q4_1 model segfaults while ggml repacks
        # it into its AMX buffer (upstream: ggml-org/llama.cpp#20824). Without repacking it runs
        # its plain AVX-512 quantized kernels; the results say so.
        note = "llama-server crashed (SIGSEGV) loading the model with weight repacking on; measured with --no-repack"
        print(f"llama.cpp {precision}: {note}", flush=True)
        server = start_llamacpp(precision, build, gguf, args, tmp, extra=("--no-repack",))
    try:
        runs = measure("llama.cpp", precision, f"{server.url}/v1/completions", {}, args)
    finally:
        server.stop()
    return {"gguf": gguf.name, "gguf_type": llamacpp.GGUF_TYPES[precision], "args": server.args, "note": note,
            "runs": runs}


def start_llamacpp(precision: str, build: dict, gguf: Path, args, tmp: Path,
                   extra: tuple[str, ...] = ()) -> llamacpp.LlamaServer | None:
    """A healthy llama-server, or None when it segfaulted while loading and repacking was on."""
    server = llamacpp.LlamaServer(build["binaries"]["llama-server"], gguf, free_port(), args.threads,
                                  args.batch_size, args.ctx, tmp / f"llama-server-{precision}.log", extra)
    try:
        server.wait_ready()
        return server
    except BaseException as err:
        server.stop()
        if isinstance(err, llamacpp.LlamaCppExited) and err.returncode == -signal.SIGSEGV and not extra:
            return None
        raise


def ratios(pairs: dict, concurrency: list[int]) -> dict:
    """Per pair, ours / llama.cpp output tok/s at each level; the top-level keys (None where a side
    is missing): ratio_c1_<p>, ratio_c16_<p>, and ttft_p99_ratio_c16 for the precision with ours'
    best throughput at 16 clients."""
    out: dict = {}
    best = None
    for precision in PRECISIONS:
        pair = pairs.get(precision) or {}
        ours = {r["concurrency"]: r for r in (pair.get("ours") or {}).get("runs", [])}
        theirs = {r["concurrency"]: r for r in (pair.get("llama.cpp") or {}).get("runs", [])}
        per_level = {}
        for c in concurrency:
            a, b = ours.get(c), theirs.get(c)
            per_level[c] = a["output_tokens_per_s"] / b["output_tokens_per_s"] if a and b and b["output_tokens_per_s"] else None
        if pair:
            pair["ratio_by_concurrency"] = {str(c): v for c, v in per_level.items()}
        out[f"ratio_c1_{precision}"] = per_level.get(1)
        out[f"ratio_c16_{precision}"] = per_level.get(16)
        if per_level.get(16) is not None and (best is None or ours[16]["output_tokens_per_s"] > best[0]):
            best = (ours[16]["output_tokens_per_s"], precision, ours[16]["ttft_p99_s"], theirs[16]["ttft_p99_s"])
    out["ttft_p99_ratio_c16"] = best[2] / best[3] if best and best[2] is not None and best[3] else None
    out["ttft_p99_ratio_c16_precision"] = best[1] if best else None
    return out


def main() -> None:
    args = parse_args()
    platform.reexec_under(args.cpu_profile)
    build = llamacpp.ensure_built(args.threads)
    print(f"llama.cpp {build['commit']} ({build['profile']}): {Path(build['binaries']['llama-server']).parent}")
    if args.build_only:
        return
    ggufs = llamacpp.ensure_ggufs(build, args.precisions)
    checkpoint = ensure_default_checkpoint(REPO / "artifacts" / "checkpoints" / "smollm2-135m-instruct")
    pairs = {}
    with tempfile.TemporaryDirectory() as tmp:
        for precision in args.precisions:
            pairs[precision] = {}
            if "ours" in args.systems:
                pairs[precision]["ours"] = sweep_ours(precision, checkpoint, ggufs[precision], args, Path(tmp))
            if "llama.cpp" in args.systems:
                pairs[precision]["llama.cpp"] = sweep_llamacpp(precision, build, ggufs[precision], args, Path(tmp))
    result = {"model": "SmolLM2-135M-Instruct", "output_tokens": args.output_tokens, "versions": versions(),
              "batch_size": args.batch_size, "batching": args.batching, "max_seq_len": args.max_seq_len,
              "max_batch_delay_ms": args.max_batch_delay_ms, "concurrency": args.concurrency,
              "continuous_call_ms": continuous_call_ms(args.handler_set) if args.batching == "continuous" else None,
              "requests": args.requests, "llama_server_ctx": args.ctx, "llama_cpp": {k: v for k, v in build.items() if k != "binaries"},
              **ratios(pairs, args.concurrency), "pairs": pairs}
    write_json(f"{args.out}.json", result)
    plot(result, RESULTS / f"{args.out}.png")
    write_section(args.out, markdown(result, " ".join(sys.argv[1:]), args.out))


def plot(r: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for i, (precision, pair) in enumerate(r["pairs"].items()):
        for system, style in (("ours", "o-"), ("llama.cpp", "s--")):
            runs = (pair.get(system) or {}).get("runs") or []
            if runs:
                label = f"{system} {precision}"
                xs = [x["concurrency"] for x in runs]
                axes[0].plot(xs, [x["output_tokens_per_s"] for x in runs], style, color=f"C{i}", label=label)
                axes[1].plot(xs, [x["ttft_p99_s"] for x in runs], style, color=f"C{i}", label=label)
    for ax, label in zip(axes, ("output tokens/s", "p99 time to first token (s)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent clients")
        ax.set_ylabel(label)
        ax.legend(fontsize=8)
    axes[1].set_yscale("log")
    fig.suptitle(f"SmolLM2-135M: this handler vs llama-server ({r['llama_cpp']['commit']}), "
                 f"{r['output_tokens']} output tokens per request", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _fmt(value: float | None, scale: float = 1, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value * scale:.{digits}f}"


def _call_ms(r: dict) -> str:
    return "" if r.get("continuous_call_ms") is None else f" (`continuous_call_ms` {r['continuous_call_ms']:g})"


def markdown(r: dict, argv: str, out: str) -> str:
    rows, v, ll = [], r["versions"], r["llama_cpp"]
    for precision, pair in r["pairs"].items():
        for system in SYSTEMS:
            side = pair.get(system)
            if side is None:
                continue
            if not side.get("runs"):
                rows.append(f"| {precision} | {system} | - | - | - | {side.get('error', 'not run')} | | |")
            for x in side.get("runs", []):
                ratio = pair.get("ratio_by_concurrency", {}).get(str(x["concurrency"])) if system == "ours" else None
                rows.append(f"| {precision} | {system} | {x['concurrency']} | {x['requests']} | {x['errors']} | "
                            f"{x['output_tokens_per_s']:.1f} | {_fmt(x['ttft_p50_s'])} / {_fmt(x['ttft_p99_s'])} | "
                            f"{_fmt(ratio) if system == 'ours' else ''} |")
    ratio_line = ", ".join(f"{p} {_fmt(r.get(f'ratio_c1_{p}'))} / {_fmt(r.get(f'ratio_c16_{p}'))}" for p in PRECISIONS)
    forced = " forced" if v.get("cpu_profile_forced") else ""
    only = "" if list(r["pairs"]) == list(PRECISIONS) else f", {', '.join(r['pairs'])} only"
    title = f": {v.get('cpu_profile')}{forced}, {r.get('batching', 'continuous')}{only}"
    notes = "".join(f"\n*llama.cpp {p}*: {pair['llama.cpp']['note']}." for p, pair in r["pairs"].items()
                    if (pair.get("llama.cpp") or {}).get("note"))
    return f"""## Side by side with llama.cpp (llama-server){title}

Command: `.venv/bin/python bench/peer.py {argv}`. Versions: torch {v['torch']}, torchserve {v.get('torchserve')},
llama.cpp {ll['commit']} (vendored in {ll['sdist']}, built with {' '.join(ll['cmake_flags'])}), {v['machine']},
CPU profile {v.get('cpu_profile')}. The same weights on both sides: the default model's Q4_1 GGUF, and BF16 / Q8_0
files requantized from it by `llama-quantize`; ours serves the bf16 checkpoint (`quantization: none`; it is the Q4_1
file dequantized) and, for int8 / int4, the very Q8_0 / Q4_1 file llama.cpp serves (`quantization: gguf`). Both get the same streamed `/v1/completions` requests, one system at a time: greedy,
{r['output_tokens']} tokens each (`ignore_eos`), prompts of 10-15 words, a fixed request count per level.
*ours*: `--batching {r.get('batching', 'continuous')}`{_call_ms(r)}, {r['batch_size']} slots, `max_seq_len` {r['max_seq_len']}, compiled.
*llama.cpp*: `llama-server -np {r['batch_size']} -c {r['llama_server_ctx']}` (parallel slots sharing one context),
`cache_prompt: false` (ours keeps no prompt cache), a new connection per request. TTFT = first streamed content.{notes}

| precision | system | clients | requests | errors | output tok/s | TTFT p50/p99 s | ours / llama.cpp tok/s |
|---|---|---|---|---|---|---|---|
{chr(10).join(rows)}

Throughput ratio ours / llama.cpp at 1 / 16 clients: {ratio_line}. p99 TTFT ratio at 16 clients (ours / llama.cpp,
{r.get('ttft_p99_ratio_c16_precision') or 'n/a'}): {_fmt(r.get('ttft_p99_ratio_c16'), digits=3)}.

![{out}](results/{out}.png)
"""


if __name__ == "__main__":
    main()
