"""Side by side with llama.cpp at its best: this handler as `./serve.sh` serves it and `llama-server`
on every GGUF type of the same width made from the same weights, the same streaming load against both
systems' /v1/completions; ratios are taken against llama.cpp's fastest type at each concurrency.
Every server of a precision is up at once and they take turns: each concurrency level runs
`--rounds` rounds, every server loaded once a round (the order reversed every other round), and a
level's numbers pool its rounds, so a slow spell of a shared host falls on both sides instead of on
whichever ran then.

    .venv/bin/python -m bench.peer                        # every precision: bf16, int8, int4
    .venv/bin/python -m bench.peer --precisions int4      # ours' int4 against Q4_0, Q4_K_M and Q4_1
    .venv/bin/python -m bench.peer --model 1b --precisions int4 --concurrency 1 16 --requests 8 32
                                                          # a 1B-class model: docs/results/peer_1b.json
    .venv/bin/python -m bench.peer --build-only           # build llama.cpp (once, cached) and stop

Ours serves the bf16 checkpoint (`quantization: none`; for the default model it is the shipped Q4_1
file dequantized), the Q8_0 file (`quantization: gguf`) and, for int4, the Q4_0 file llama.cpp serves
(`--ours-int4 Q4_1`: the default model's shipped file, as ./serve.sh serves it; bench/peer_models.py).
llama.cpp serves BF16; Q8_0; Q4_0, Q4_K_M and
Q4_1 (bench/peer_llamacpp.py's GGUF_TYPES). Memory (worker RSS and llama-server RSS after the load)
and the time ours took to compile are recorded. It is built once from the
tree vendored in the llama-cpp-python sdist (15-40 minutes on 2 cores) and cached with the GGUFs
under $XDG_CACHE_HOME/ts-llm/llama.cpp. Client-side time to first token and the gap between
streamed tokens (p50/p99) are recorded beside tokens/s. Writes docs/results/peer.json (+ raw
per-request records), docs/results/peer.png and the peer section of docs/benchmarks.md.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import re
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import psutil
import yaml

from bench import peer_llamacpp as llamacpp, peer_models, random_gguf
from bench.common import REPO, RESULTS, versions, write_json, write_section
from bench.load import PROMPTS, Record, as_rows, run_load, span, summarize
from handler.engine import platform
from handler.packing.archive import build_mar
from handler.packing.model_config import ServingOptions, handler_config
from handler.serving.config import HandlerConfig
from handler.torchserve.launch import Ports, TorchServe, free_port, start_torchserve
from handler.typed_config import flag

PRECISIONS = {"bf16": "none", "int8": "gguf", "int4": "gguf"}  # ours' handler `quantization` per precision
WIDTH = {"bf16": 16, "int8": 8, "int4": 4}
SYSTEMS = ("ours", "llama.cpp")


def parse_args(argv: list[str] | None = None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=list(peer_models.MODELS), default="default",
                   help="default: SmolLM2-135M-Instruct; 1b, 3b, 8b: Llama 3.x bodies, random weights (bench/peer_models.py)")
    p.add_argument("--precisions", nargs="+", choices=list(PRECISIONS), default=list(PRECISIONS))
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 64])
    p.add_argument("--requests", type=int, nargs="+", default=[32, 32, 64, 64],
                   help="requests per concurrency level (32 at one client: a few slow requests on a shared host move 8 a lot)")
    p.add_argument("--rounds", type=int, default=3,
                   help="rounds a level: every server takes the level's requests once a round, in turn")
    p.add_argument("--warmup-s", type=float, default=60,
                   help="seconds of unrecorded 1-client requests each server takes before the rounds (see warm_up)")
    p.add_argument("--output-tokens", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=16, help="ours' batchSize and llama-server's -np (parallel slots)")
    p.add_argument("--batching", choices=["continuous", "async"], default="continuous",
                   help="ours' batching mode (bench/modes.py compares them)")
    p.add_argument("--max-seq-len", type=int, default=512, help="ours' max_seq_len")
    add_ours_options(p)
    p.add_argument("--ctx", type=int, default=16384, help="llama-server's -c (shared by its slots)")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="llama-server's -t/-tb; build jobs")
    p.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    p.add_argument("--peer-types", nargs="+", metavar="TYPE", help="llama.cpp's GGUF types to run (default: every "
                   "type of each precision; an 8B's three int4 servers would not fit 24 GiB beside ours)")
    p.add_argument("--ours-int4", metavar="TYPE", help="the GGUF type ours serves at int4 (default: the model's, "
                   "peer_models.MODELS; Q4_1 is the default model's shipped file)")
    p.add_argument("--cpu-profile", metavar="NAME", help="run under this CPU profile: ours forced to it, llama.cpp "
                   "built for it (avx2: explicit AVX2 flags, a build of its own)")
    p.add_argument("--build-only", action="store_true", help="build llama.cpp (cached) and stop")
    p.add_argument("--out", help="results name: docs/results/<out>.json and .png, the <out> section of "
                   "docs/benchmarks.md (default: peer, peer_1b, peer_3b, peer_8b; another name keeps a partial run beside the full one)")
    args = p.parse_args(argv)
    if len(args.requests) != len(args.concurrency):
        p.error("--requests needs one count per --concurrency level")
    args.out = args.out or peer_models.MODELS[args.model].out
    return args


def add_ours_options(p: argparse.ArgumentParser) -> None:
    """What ours_server reads beyond the load's own options (bench/modes.py shares them)."""
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


def handler_setting(handler_set: list[str], key: str):
    """What ours' handler was given for `key`: --handler-set's value, else HandlerConfig's default."""
    return handler_settings(handler_set).get(key, getattr(HandlerConfig, key))


def bodies(n: int, args) -> list[dict]:
    """The same OpenAI completions requests for both: greedy, exactly output_tokens (ignore_eos). Each
    keeps its prompt cache at its default (on: llama.cpp's cache_prompt, ours' prefix_caching)."""
    return [{"prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": args.output_tokens, "temperature": 0,
             "ignore_eos": True, "stream_options": {"include_usage": True}} for i in range(n)]


@dataclass(frozen=True)
class Server:
    """One server under the load: where its completions are, and what its side records beside its runs
    (`describe`, called while it is up: memory, compile time)."""
    url: str
    headers: dict
    describe: Callable[[], dict]
    torchserve: TorchServe | None = None  # ours' instance (bench.contention starts a sidecar beside it)


Key = tuple[str, str]  # (system, label): ("ours", precision) or ("llama.cpp", GGUF type)
K = TypeVar("K")  # a server's key in turns: a Key here, a name in bench.contention


def turns(keys: list[K], concurrency: list[int], requests: list[int], rounds: int) -> list[tuple[int, int, K]]:
    """(level, requests, server) in the order they are measured: level by level, each server once a
    round, the order reversed every other round (neither side always runs right after the other)."""
    return [(c, n, key) for c, n in zip(concurrency, requests, strict=True)
            for r in range(rounds) for key in (keys if r % 2 == 0 else keys[::-1])]


def measure_rounds(servers: dict[Key, Server], args) -> dict[Key, list[dict]]:
    """Each server's runs, a summary a level over its pooled rounds."""
    # A connection per request, for both: llama-server closes idle keep-alive connections, and a POST
    # sent on one it just closed fails (RemoteDisconnected) without ever reaching it.
    headers = {key: {**server.headers, "Connection": "close"} for key, server in servers.items()}
    for key, server in servers.items():
        warm_up(functools.partial(run_load, server.url, headers[key], bodies(WARMUP_BATCH, args), 1, stream=True),
                args.warmup_s)
    loads: dict[Key, dict[int, list[list[Record]]]] = {key: {c: [] for c in args.concurrency} for key in servers}
    for c, n, key in turns(list(servers), args.concurrency, args.requests, args.rounds):
        loads[key][c].append(run_load(servers[key].url, headers[key], bodies(n, args), c, stream=True))
    return {key: [level_summary(key, c, rounds, args) for c, rounds in levels.items()] for key, levels in loads.items()}


WARMUP_BATCH = 2  # requests a warm-up send makes


def warm_up(send: Callable[[], object], seconds: float, clock: Callable[[], float] = time.monotonic) -> int:
    """Calls `send` (WARMUP_BATCH unrecorded 1-client requests) until `seconds` have passed, once at
    least; how many requests were sent. Ours' frontend is a JVM: its JIT needs several thousand
    calls (a call a token at 1 client) to reach its steady speed, and until then it takes 2-3x the
    CPU a token that it takes warm, on the cores the engine needs. Every server gets the same
    warm-up, so both sides are measured as they serve once up a minute (docs/benchmarks.md, "Warm-up")."""
    deadline, sent = clock() + seconds, 0
    while sent == 0 or clock() < deadline:
        send()
        sent += WARMUP_BATCH
    return sent


def pooled(rounds: list[list[Record]]) -> dict:
    """One level's rounds pooled: latencies over every request, tokens/s over the rounds' own time."""
    records = [r for one in rounds for r in one]
    return {"rounds": len(rounds), **summarize(records, duration=sum(span(one) for one in rounds))}


def level_summary(key: Key, c: int, rounds: list[list[Record]], args) -> dict:
    records = [r for one in rounds for r in one]
    summary = {"concurrency": c, **pooled(rounds)}
    summary["tokens_per_request"] = summary["output_tokens"] / max(summary["requests"] - summary["errors"], 1)
    system, label = key
    (RESULTS / "raw").mkdir(parents=True, exist_ok=True)
    (RESULTS / "raw" / f"{args.out}_{system}_{label}_c{c}.json").write_text(json.dumps(as_rows(records)))
    print(f"{system} {label} c={c}: {summary['output_tokens_per_s']:.1f} tok/s, TTFT p50/p99 "
          f"{fmt(summary['ttft_p50_s'])}/{fmt(summary['ttft_p99_s'])} s, gap p50/p99 "
          f"{fmt(summary['itl_p50_s'], 1e3, 1)}/{fmt(summary['itl_p99_s'], 1e3, 1)} ms, "
          f"{summary['tokens_per_request']:.1f} tokens/request, errors {summary['errors']}", flush=True)
    return summary


def ours_checkpoint(precision: str, checkpoint: Path, gguf: Path | None, tmp: Path, name: str = "") -> Path:
    """The default checkpoint with the pair's GGUF beside it (linked, not copied): under
    quantization: gguf ours serves exactly llama.cpp's file."""
    out = tmp / f"checkpoint-{precision}{name}"
    out.mkdir()
    for f in checkpoint.iterdir():
        if f.is_file() and f.suffix != ".gguf":
            os.link(f, out / f.name)
    if PRECISIONS[precision] == "gguf":
        assert gguf is not None, f"{precision} serves the pair's GGUF: give it"
        os.link(gguf, out / gguf.name)
    return out


def peer_types(precision: str, args) -> list[str]:
    """llama.cpp's GGUF types of `precision` that run (--peer-types narrows them)."""
    return [k for k in llamacpp.GGUF_TYPES[precision] if not args.peer_types or k in args.peer_types]


def sweep(precision: str, checkpoint: Path, gguf: Path | None, ggufs: dict[str, Path], build: dict, args,
          tmp: Path) -> dict:
    """The precision's pair: ours and every GGUF type of its width, all up at once, measured in
    turns (measure_rounds); which type was fastest at each level."""
    with contextlib.ExitStack() as stack:
        servers: dict[Key, Server] = {}
        if "ours" in args.systems:
            servers[("ours", precision)] = stack.enter_context(ours_server(precision, checkpoint, gguf, args, tmp))
        if "llama.cpp" in args.systems:
            for kind in peer_types(precision, args):
                servers[("llama.cpp", kind)] = stack.enter_context(llamacpp_server(kind, build, ggufs[kind], args, tmp))
        runs = measure_rounds(servers, args)
        sides = {key: {**server.describe(), "runs": runs[key]} for key, server in servers.items()}
    pair = {"ours": sides[("ours", precision)]} if ("ours", precision) in sides else {}
    formats = {kind: side for (system, kind), side in sides.items() if system == "llama.cpp"}
    if formats:
        pair["llama.cpp"] = {"formats": formats, "fastest": fastest(formats, args.concurrency)}
    return pair


@contextlib.contextmanager
def ours_server(precision: str, checkpoint: Path, gguf: Path | None, args, tmp: Path, env: dict[str, str] | None = None,
                name: str = "") -> Iterator[Server]:
    """`env`: more of TorchServe's (so its workers') environment; `name` tells two servers of one precision apart."""
    handler = {"dtype": "auto", "max_seq_len": args.max_seq_len, "served_model_name": "llm",
               "quantization": PRECISIONS[precision], **handler_settings(args.handler_set)}
    opts = ServingOptions(args.batching, args.batch_size, args.max_batch_delay_ms, handler=handler)
    checkpoint = ours_checkpoint(precision, checkpoint, gguf, tmp, name)
    handler_config(opts, checkpoint)  # a refused option fails here, in a second, not in a worker
    run_dir = tmp / f"ours-{precision}-{args.batching}{name}"
    build_mar(checkpoint, "llm", run_dir / "model_store", opts)
    started = time.monotonic()
    ts = start_torchserve(run_dir / "model_store", {"llm": "llm.mar"}, REPO / "config.properties", run_dir / "work",
                          Ports.free(), env=env)
    since_start: dict[str, float] = {}  # the start's wall time: to the worker READY, to compiled steps served

    def describe() -> dict:
        (worker,) = ts.client("llm").describe().workers
        compiled = re.search(r"compiled steps loaded in the background in ([\d.]+) s", ts.model_log())
        return {"batching": args.batching, "handler": opts.handler, "gguf": gguf.name if gguf else None,
                "worker_rss_bytes": psutil.Process(worker.process()).memory_info().rss,
                "compiled_after_s": float(compiled[1]) if compiled else None, "since_start_s": since_start}

    try:
        ts.wait_ready("llm", timeout=1800)
        since_start["ready"] = time.monotonic() - started
        ts.wait_compiled("llm", time.monotonic() + 3600)  # ready at once; measured once compiled
        since_start["compiled"] = time.monotonic() - started
        yield Server(f"{ts.inference_url}/predictions/llm/1.0/v1/completions", ts.headers(), describe, ts)
    finally:
        ts.stop()


def fastest(formats: dict, concurrency: list[int]) -> dict[str, str | None]:
    """{level: the type with the most output tokens/s there} (None where no type ran it)."""
    out = {}
    for c in concurrency:
        speeds = {k: r["output_tokens_per_s"] for k, f in formats.items() for r in f["runs"] if r["concurrency"] == c}
        out[str(c)] = max(speeds, key=speeds.__getitem__) if speeds else None
    return out


@contextlib.contextmanager
def llamacpp_server(kind: str, build: dict, gguf: Path, args, tmp: Path) -> Iterator[Server]:
    server, note = start_llamacpp(kind, build, gguf, args, tmp), None
    if server is None:
        # Seen on two AMX machines (2-core VMs): every quantized model segfaults while ggml repacks
        # it into its AMX buffer (upstream: ggml-org/llama.cpp#20824, machine-dependent). Its next
        # best is the same build less AMX, which repacks for its AVX-512 kernels (--no-repack would
        # be its slowest path); the results say so.
        build = llamacpp.ensure_built(args.threads, without_amx=True)
        note = ("llama-server's AMX build crashed (SIGSEGV) repacking the model into its AMX buffer; "
                f"measured with the native build less AMX ({llamacpp.NO_AMX}), which repacks for AVX-512")
        print(f"llama.cpp {kind}: {note}", flush=True)
        server = start_llamacpp(kind, build, gguf, args, tmp, retry=False)
    assert server is not None  # a second failed start raises

    def describe() -> dict:
        return {"gguf": gguf.name, "args": server.args, "note": note,
                "rss_bytes": psutil.Process(server.proc.pid).memory_info().rss}

    try:
        yield Server(f"{server.url}/v1/completions", {}, describe)
    finally:
        server.stop()


def start_llamacpp(kind: str, build: dict, gguf: Path, args, tmp: Path, retry: bool = True) -> llamacpp.LlamaServer | None:
    """A healthy llama-server, or None when it segfaulted while loading and `retry` allows another build."""
    server = llamacpp.LlamaServer(build["binaries"]["llama-server"], gguf, free_port(), args.threads,
                                  args.batch_size, args.ctx, tmp / f"llama-server-{kind}.log",
                                  unified=getattr(args, "kv_unified", False))
    try:
        server.wait_ready()
        return server
    except BaseException as err:
        server.stop()
        if isinstance(err, llamacpp.LlamaCppExited) and err.returncode == -signal.SIGSEGV and retry:
            return None
        raise


def ratios(pairs: dict, concurrency: list[int]) -> dict:
    """Per pair, ours against llama.cpp's fastest type at each level: tokens/s ours / theirs, and
    TTFT p50 and inter-token gap p99 ours / that run's. Top-level keys (None where a side is missing):
    ratio_best<width>_c<level> for every precision and level; for int4, ttft_p50_ratio_c16 and
    itl_p99_ratio_c1."""
    out: dict = {}
    for precision, width in WIDTH.items():
        pair = pairs.get(precision) or {}
        ours = {r["concurrency"]: r for r in (pair.get("ours") or {}).get("runs", [])}
        theirs = pair.get("llama.cpp") or {}
        best = {c: _run_of(theirs, (theirs.get("fastest") or {}).get(str(c)), c) for c in concurrency}
        by_level = {str(c): {"tokens_per_s": ratio_of(ours.get(c), best[c], "output_tokens_per_s"),
                             "ttft_p50": ratio_of(ours.get(c), best[c], "ttft_p50_s"),
                             "itl_p99": ratio_of(ours.get(c), best[c], "itl_p99_s")} for c in concurrency}
        if pair:
            pair["ratio_by_concurrency"] = by_level
        for c in concurrency:
            out[f"ratio_best{width}_c{c}"] = by_level[str(c)]["tokens_per_s"]
        if precision == "int4":
            out["ttft_p50_ratio_c16"] = (by_level.get("16") or {}).get("ttft_p50")
            out["itl_p99_ratio_c1"] = (by_level.get("1") or {}).get("itl_p99")
    return out


def _run_of(side: dict, kind: str | None, c: int) -> dict | None:
    runs = ((side.get("formats") or {}).get(kind) or {}).get("runs", [])
    return next((r for r in runs if r["concurrency"] == c), None)


def ratio_of(a: dict | None, b: dict | None, key: str) -> float | None:
    """a[key] / b[key] of two runs, None where either is missing (bench.contention too)."""
    return a[key] / b[key] if a and b and a.get(key) is not None and b.get(key) else None


def main() -> None:
    args = parse_args()
    platform.reexec_under(args.cpu_profile)
    build = llamacpp.ensure_built(args.threads)
    print(f"llama.cpp {build['commit']} ({build['profile']}): {Path(build['binaries']['llama-server']).parent}")
    if args.build_only:
        return
    model = peer_models.MODELS[args.model]
    checkpoint = peer_models.checkpoint(model)
    ours_gguf = {**model.ours_gguf, **({"int4": args.ours_int4} if args.ours_int4 else {})}
    kinds = [k for p in args.precisions for k in peer_types(p, args)]
    ggufs = peer_models.ggufs(model, build, checkpoint, kinds + [ours_gguf[p] for p in args.precisions if p in ours_gguf])
    pairs = {}
    with tempfile.TemporaryDirectory() as tmp:
        for precision in args.precisions:
            gguf = ggufs.get(ours_gguf.get(precision, ""))
            pairs[precision] = sweep(precision, checkpoint, gguf, ggufs, build, args, Path(tmp))
    result = {"model": model.name, "ours_gguf": ours_gguf, "gguf_only": args.model in random_gguf.BODIES,
              "output_tokens": args.output_tokens, "versions": versions(),
              "batch_size": args.batch_size, "batching": args.batching, "max_seq_len": args.max_seq_len,
              "max_batch_delay_ms": args.max_batch_delay_ms, "concurrency": args.concurrency,
              **{key: handler_setting(args.handler_set, key) if args.batching == "continuous" else None
                 for key in ("continuous_call_ms", "continuous_step_ahead")},
              "requests": args.requests, "rounds": args.rounds, "warmup_s": args.warmup_s, "llama_server_ctx": args.ctx,
              "llama_cpp": {k: v for k, v in build.items() if k != "binaries"},
              **ratios(pairs, args.concurrency), "pairs": pairs}
    write_json(f"{args.out}.json", result)
    plot(result, RESULTS / f"{args.out}.png")
    write_section(args.out, markdown(result, " ".join(sys.argv[1:]), args.out))


def sides(r: dict):
    """(precision, label, runs) for ours and each llama.cpp type, in the order they ran."""
    for precision, pair in r["pairs"].items():
        if pair.get("ours"):
            yield precision, f"ours {precision}", pair["ours"]
        for kind, side in ((pair.get("llama.cpp") or {}).get("formats") or {}).items():
            yield precision, f"llama.cpp {kind}", side


def plot(r: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    panels = (("output_tokens_per_s", "output tokens/s", 1), ("ttft_p50_s", "time to first token p50 (s)", 1),
              ("itl_p99_s", "gap between tokens p99 (ms)", 1e3))
    for i, (_, label, side) in enumerate(sides(r)):
        runs = side.get("runs") or []
        style = "o-" if label.startswith("ours") else "s--"
        for ax, (key, _, scale) in zip(axes, panels):
            points = [(x["concurrency"], x[key] * scale) for x in runs if x.get(key) is not None]
            if points:
                ax.plot(*zip(*points), style, color=f"C{i}", label=label)
    for ax, (_, label, _) in zip(axes, panels):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent clients")
        ax.set_ylabel(label)
        ax.legend(fontsize=7)
    axes[1].set_yscale("log")
    axes[2].set_yscale("log")
    fig.suptitle(f"{r['model']}: this handler vs llama-server ({r['llama_cpp']['commit']}) on every GGUF type of each "
                 f"width, {r['output_tokens']} output tokens per request, {r['versions']['machine']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def fmt(value: float | None, scale: float = 1, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value * scale:.{digits}f}"


def _call_ms(r: dict) -> str:
    if r.get("continuous_call_ms") is None:
        return ""
    return f" (`continuous_call_ms` {r['continuous_call_ms']:g}, `continuous_step_ahead` {r.get('continuous_step_ahead')})"


def _rounds(r: dict) -> str:
    return (f"every server up at once, taking turns: each level in {r['rounds']} rounds, every server loaded once a "
            "round (order reversed every other round), the requests column counting all rounds; before the rounds "
            f"each server took {r['warmup_s']:g} s of unrecorded 1-client requests (warm_up)")


def _ours_weights(r: dict) -> str:
    gguf = " / ".join(r["ours_gguf"].values())
    if r.get("gguf_only"):  # random_gguf's bodies: no float checkpoint exists
        return f"ours serves the very {gguf} GGUF files alone (no float checkpoint; `quantization: gguf`)"
    return f"ours serves the bf16 checkpoint and, for int8 / int4, the {gguf} GGUF beside it (`quantization: gguf`)"


def markdown(r: dict, argv: str, out: str) -> str:
    rows, v, ll = [], r["versions"], r["llama_cpp"]
    for precision, label, side in sides(r):
        pair = r["pairs"][precision]
        if not side.get("runs"):
            rows.append(f"| {precision} | {label} | - | - | - | {side.get('error', 'not run')} | | | |")
        for x in side.get("runs", []):
            c = str(x["concurrency"])
            best = (pair.get("llama.cpp") or {}).get("fastest", {}).get(c)
            mark = " (fastest)" if label == f"llama.cpp {best}" else ""
            ratio = (pair.get("ratio_by_concurrency") or {}).get(c, {}).get("tokens_per_s") if label.startswith("ours") else None
            rows.append(f"| {precision} | {label}{mark} | {c} | {x['requests']} | {x['errors']} | "
                        f"{x['output_tokens_per_s']:.1f} | {fmt(x['ttft_p50_s'])} / {fmt(x['ttft_p99_s'])} | "
                        f"{fmt(x['itl_p50_s'], 1e3, 1)} / {fmt(x['itl_p99_s'], 1e3, 1)} | {fmt(ratio)} |")
    keys = [k for k in r if k.startswith(("ratio_best", "ttft_p50_ratio", "itl_p99_ratio"))]
    key_line = ", ".join(f"`{k}` {fmt(r[k])}" for k in keys)
    forced = " forced" if v.get("cpu_profile_forced") else ""
    only = "" if list(r["pairs"]) == list(PRECISIONS) else f", {', '.join(r['pairs'])} only"
    body = f"{r['model']}, " if r.get("gguf_only") else ""  # several bodies' sections in one file: told apart
    title = f": {body}{v.get('cpu_profile')}{forced}, {r.get('batching', 'continuous')}{only}"
    notes = "".join(f"\n*llama.cpp {k}*: {side['note']}." for _, label, side in sides(r) if side.get("note")
                    for k in [label.split()[-1]])
    return f"""## Side by side with llama.cpp at its best (llama-server){title}

Command: `.venv/bin/python -m bench.peer {argv}`. Versions: torch {v['torch']}, torchserve {v.get('torchserve')},
llama.cpp {ll['commit']} (vendored in {ll['sdist']}, built with {' '.join(ll['cmake_flags'])}), **{v['machine']}**,
CPU profile {v.get('cpu_profile')}. Model: {r['model']}. The same weights on every side: {_ours_weights(r)}; llama.cpp \
serves every GGUF type of the same width made from the same
weights by `llama-quantize`, and each ratio is ours against the **fastest** of them at that concurrency. Both get the
same streamed `/v1/completions` requests: greedy, {r['output_tokens']} tokens each (`ignore_eos`), prompts of 10-15
words, {_rounds(r)}. TTFT = first streamed content, client side;
the gap is between consecutive streamed chunks of one request, client side.
*ours*: `--batching {r.get('batching', 'continuous')}`{_call_ms(r)}, {r['batch_size']} slots, `max_seq_len` {r['max_seq_len']}, compiled.
*llama.cpp*: `llama-server -np {r['batch_size']} -c {r['llama_server_ctx']}` (parallel slots sharing one context),
its prompt cache at its default (on, as ours' prefix cache), a new connection per request.{notes}

| precision | server | clients | requests | errors | output tok/s | TTFT p50/p99 s | gap p50/p99 ms | ours / fastest tok/s |
|---|---|---|---|---|---|---|---|---|
{chr(10).join(rows)}

Ours / llama.cpp's fastest type of the same width: {key_line}.

![{out}](results/{out}.png)
"""


if __name__ == "__main__":
    main()
