"""The sizes users serve (issue 59): a model body (1B, 3B, 8B), ours and llama-server on the same
GGUF files with the same KV budget: ours `kv_tokens`, llama-server's `-c` as one pool
(--kv-unified), both 16 slots.

- Tokens/s at 1 and 16 clients, on each GGUF type (Q4_0, Q4_K_M); the ratio takes each side's
  faster type.
- On the first type: the first token at one client for prompts of about 1k, 4k and 16k tokens
  (each new to both prompt caches: words drawn with a seed of its own), and for a short prompt.
- A mixed load: streams decoding while a 4k-token prompt arrives every few seconds; the decoding
  streams' gap between tokens p50/p99, and the long prompts' first token under that load.
- Each server's RSS after loading and after the load.
- Ours' start: the cold compile (a compile cache of its own, empty), the worker READY, and a warm
  restart on that cache.

    .venv/bin/python -m bench.scale                       # the 1B: long prompts, 16k context, mixed load
    .venv/bin/python -m bench.scale --model 8b --types Q4_0 Q4_K_M --long-tokens 1024 4096 --parts throughput short long

Writes docs/results/scale_<model>.json (+ raw records), docs/results/scale_<model>.png, the model's
section of docs/benchmarks.md, and docs/results/scale.json: every model's targets side by side.
Speed does not depend on the weights' values, so random bodies stand in for trained ones
(ignore_eos: every answer runs its length).
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import random
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from bench import peer, peer_llamacpp as llamacpp, peer_models
from bench.common import RESULTS, versions, write_json, write_section
from bench.load import Record, run_load, summarize
from handler.engine.config import EngineConfig
from handler.engine.tokenizer import Tokenizer
from handler.packing.model_config import ServingOptions

PARTS = ("throughput", "short", "long", "mixed")
THROUGHPUT = ((1, 8), (16, 32))  # (clients, requests), as bench.peer
WORDS = ("river", "stone", "light", "paper", "garden", "window", "quiet", "market", "winter", "signal", "forest",
         "letter", "bridge", "silver", "engine", "harbor", "orange", "pocket", "meadow", "thunder", "candle",
         "island", "mirror", "velvet", "ladder", "rocket", "shadow", "canvas", "copper", "lantern", "valley")


def parse_args(argv: list[str] | None = None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=list(peer_models.MODELS), default="1b")
    p.add_argument("--types", nargs="+", default=["Q4_0"], choices=["Q4_0", "Q4_K_M"],
                   help="GGUF types both serve; the first also gets the short, long and mixed parts")
    p.add_argument("--parts", nargs="+", choices=PARTS, default=["short", "long", "mixed"])
    p.add_argument("--long-tokens", type=int, nargs="+", default=[1024, 4096, 16000],
                   help="prompt lengths whose first token is timed at one client")
    p.add_argument("--max-seq-len", type=int, default=16384, help="ours' longest request (prompt + answer)")
    p.add_argument("--ctx", type=int, default=20480,
                   help="the KV budget of both: ours kv_tokens, llama-server's -c (one pool)")
    p.add_argument("--short-requests", type=int, default=8)
    p.add_argument("--mixed-streams", type=int, default=8)
    p.add_argument("--mixed-output", type=int, default=160, help="tokens each decoding stream asks for")
    p.add_argument("--mixed-prompt", type=int, default=4096, help="tokens of each prompt arriving under the load")
    p.add_argument("--mixed-arrivals", type=int, default=3)
    p.add_argument("--mixed-every-s", type=float, default=6.0)
    p.add_argument("--warmup-s", type=float, default=20)
    p.add_argument("--output-tokens", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="llama-server's -t/-tb; build jobs")
    p.add_argument("--activations", choices=["fine", "int8"], default=EngineConfig.activations,
                   help="ours' (handler activations); int8 rounds x as llama.cpp's Q8 activations do. Not the "
                        "default: its results are scale_<model>_int8.json, its keys suffixed _<model>_int8")
    args = p.parse_args(argv)
    # the keys' suffix: the model, and the activations when they are not the default
    args.key = args.model if args.activations == EngineConfig.activations else f"{args.model}_{args.activations}"
    args.out = f"scale_{args.key}"
    # what bench.peer's servers read
    args.batching, args.systems = "continuous", list(peer.SYSTEMS)
    args.handler_set = [f"kv_tokens={args.ctx}", f"activations={args.activations}"]
    args.max_batch_delay_ms, args.kv_unified = ServingOptions.max_batch_delay_ms, True
    return args


def prompt_of(tok: Tokenizer, tokens: int, seed: int) -> str:
    """Words drawn with `seed`, cut to about `tokens` tokens (re-encoding may move the cut by a token or two)."""
    rng = random.Random(seed)
    text = " ".join(rng.choice(WORDS) for _ in range(tokens + 64))
    return tok.decode(tok.encode(text)[:tokens - 8]) + ". Summarize."


def one(server: peer.Server, prompt: str, max_tokens: int) -> Record:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream_options": {"include_usage": True}}
    (record,) = run_load(server.url, {**server.headers, "Connection": "close"}, [body], 1, stream=True, timeout=1800)
    return record


def first_token(record: Record) -> float | None:
    return record.first - record.start if record.first and record.status == 200 else None


def long_prompts(server: peer.Server, tok: Tokenizer, args) -> dict:
    out = {}
    for i, n in enumerate(args.long_tokens):
        record = one(server, prompt_of(tok, n, seed=1000 + i), 4)
        out[str(n)] = {"status": record.status, "prompt_tokens": record.prompt_tokens, "ttft_s": first_token(record),
                       "error": record.error}
        print(f"  {n}-token prompt: status {record.status}, {record.prompt_tokens} tokens, first token "
              f"{peer.fmt(first_token(record))} s", flush=True)
    return out


def mixed(server: peer.Server, tok: Tokenizer, args) -> dict:
    """`mixed_streams` clients decoding short prompts while long prompts arrive every mixed_every_s."""
    headers = {**server.headers, "Connection": "close"}
    bodies = [{"prompt": f"{peer.bodies(1, args)[0]['prompt']} ({i})", "max_tokens": args.mixed_output, "temperature": 0,
               "ignore_eos": True, "stream_options": {"include_usage": True}} for i in range(args.mixed_streams)]
    streams: list[Record] = []
    decoding = threading.Thread(target=lambda: streams.extend(run_load(server.url, headers, bodies, len(bodies), True)))
    decoding.start()
    arrivals = []
    for i in range(args.mixed_arrivals):
        time.sleep(args.mixed_every_s)
        arrivals.append(one(server, prompt_of(tok, args.mixed_prompt, seed=2000 + i), 4))
    decoding.join()
    summary = summarize(streams)
    out = {"streams": summary, "arrivals_ttft_s": [first_token(r) for r in arrivals],
           "arrivals_status": [r.status for r in arrivals]}
    print(f"  mixed: streams' gap p50/p99 {peer.fmt(summary['itl_p50_s'], 1e3, 1)}/{peer.fmt(summary['itl_p99_s'], 1e3, 1)} "
          f"ms, long prompts' first token {[peer.fmt(t) for t in out['arrivals_ttft_s']]} s", flush=True)
    return out


def throughput(server: peer.Server, args) -> dict:
    headers = {**server.headers, "Connection": "close"}
    out = {}
    for clients, requests in THROUGHPUT:
        out[str(clients)] = summarize(run_load(server.url, headers, peer.bodies(requests, args), clients, stream=True))
        print(f"  {clients} clients: {out[str(clients)]['output_tokens_per_s']:.2f} tok/s", flush=True)
    return out


def measure(server: peer.Server, tok: Tokenizer, args, parts: list[str]) -> dict:
    out = {"loaded": server.describe()}
    if "throughput" in parts:
        out["throughput"] = throughput(server, args)
    if "short" in parts:
        out["short_c1"] = summarize(run_load(server.url, {**server.headers, "Connection": "close"},
                                             peer.bodies(args.short_requests, args), 1, stream=True))
        print(f"  short prompt at 1 client: first token p50 {peer.fmt(out['short_c1']['ttft_p50_s'], 1e3, 0)} ms", flush=True)
    if "long" in parts:
        out["long"] = long_prompts(server, tok, args)
    if "mixed" in parts:
        out["mixed"] = mixed(server, tok, args)
    return out | {"after": server.describe()}


def rss(side: dict, when: str) -> int | None:
    d = side[when]
    return d.get("worker_rss_bytes") or d.get("rss_bytes")


def ratio(a, b):
    return a / b if a is not None and b else None


def targets(runs: dict, start: dict, args) -> dict:
    """The issue's keys for this model (suffix `_<model>`): each from the first type's pair, the
    tokens/s ratio from each side's faster type."""
    m, first = args.key, runs[args.types[0]]
    ours, theirs = first["ours"], first["llama.cpp"]
    out: dict = {}
    if "throughput" in args.parts:
        for c, _ in THROUGHPUT:
            best = {side: max(runs[t][side]["throughput"][str(c)]["output_tokens_per_s"] for t in args.types)
                    for side in ("ours", "llama.cpp")}
            out[f"ratio_{m}_c{c}"] = ratio(best["ours"], best["llama.cpp"])
            for t in args.types:
                out[f"ratio_{m}_{t}_c{c}"] = ratio(runs[t]["ours"]["throughput"][str(c)]["output_tokens_per_s"],
                                                   runs[t]["llama.cpp"]["throughput"][str(c)]["output_tokens_per_s"])
    if "long" in args.parts:
        for n in args.long_tokens:
            out[f"ttft_{n // 1000}k_ratio_{m}"] = ratio(ours["long"][str(n)]["ttft_s"], theirs["long"][str(n)]["ttft_s"])
        longest = str(max(args.long_tokens))
        out[f"context_{int(longest) // 1000}k_served_{m}"] = (ours["long"][longest]["status"] == 200
                                                              and ours["long"][longest]["prompt_tokens"] >= 0.9 * int(longest))
    if "short" in args.parts:
        out[f"ttft_short_ratio_c1_{m}"] = ratio(ours["short_c1"]["ttft_p50_s"], theirs["short_c1"]["ttft_p50_s"])
    if "mixed" in args.parts:
        out[f"mixed_itl_p99_ratio_{m}"] = ratio(ours["mixed"]["streams"]["itl_p99_s"], theirs["mixed"]["streams"]["itl_p99_s"])
        out[f"mixed_itl_p50_ratio_{m}"] = ratio(ours["mixed"]["streams"]["itl_p50_s"], theirs["mixed"]["streams"]["itl_p50_s"])
    out[f"rss_ratio_{m}"] = ratio(rss(ours, "after"), rss(theirs, "after"))
    out[f"compile_{m}_s"] = start["cold"]["compiled_after_s"]
    out[f"ready_{m}_s"] = start["cold"]["since_start_s"]["ready"]
    out[f"warm_restart_{m}_compiled_s"] = start["warm"]["since_start_s"]["compiled"]
    if m == "1b":  # the issue names the 1B's mixed-load and 16k-context targets without the suffix
        out |= {key: out[f"{key}_1b"] for key in ("mixed_itl_p99_ratio", "context_16k_served") if f"{key}_1b" in out}
    return out


def with_cache(args, tmp: Path, kind: str) -> argparse.Namespace:
    """args with a compile cache of this run's own for ours on `kind` (a directory holds one
    artifact): its first start compiles cold, the restart loads what it installed."""
    return argparse.Namespace(**{**vars(args), "handler_set": [*args.handler_set, f"compile_cache_dir={tmp / f'aot-{kind}'}"]})


def restart(serve) -> dict:
    """Ours started again on the compile cache its first start filled: READY and compiled, from the start."""
    with serve() as server:
        described = server.describe()
    print(f"  warm restart: READY {described['since_start_s']['ready']:.1f} s, compiled steps "
          f"{described['since_start_s']['compiled']:.1f} s from the start", flush=True)
    return described


def main() -> None:
    args = parse_args()
    build = llamacpp.ensure_built(args.threads)
    model = peer_models.MODELS[args.model]
    checkpoint = peer_models.checkpoint(model)
    ggufs = peer_models.ggufs(model, build, checkpoint, args.types)
    tok = Tokenizer.from_dir(checkpoint)
    runs: dict[str, dict[str, dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for i, kind in enumerate(args.types):
            parts = args.parts if i == 0 else [p for p in args.parts if p == "throughput"]
            ours = functools.partial(peer.ours_server, "int4", checkpoint, ggufs[kind], name=f"-{kind}")
            theirs = functools.partial(peer.llamacpp_server, kind, build, ggufs[kind])
            runs[kind] = {}
            for key, serve in (("ours", ours), ("llama.cpp", theirs)):
                with serve(with_cache(args, Path(tmp), kind), Path(tmp)) as server:
                    headers = {**server.headers, "Connection": "close"}
                    peer.warm_up(functools.partial(run_load, server.url, headers, peer.bodies(peer.WARMUP_BATCH, args), 1,
                                                   stream=True), args.warmup_s)
                    print(f"{key} {kind}", flush=True)
                    runs[kind][key] = measure(server, tok, args, parts)
        first = args.types[0]
        start = {"cold": runs[first]["ours"]["loaded"],
                 "warm": restart(functools.partial(peer.ours_server, "int4", checkpoint, ggufs[first],
                                                   with_cache(args, Path(tmp), first), Path(tmp),
                                                   name=f"-{first}-restart"))}
    result = {"model": model.name, "out": args.key, "activations": args.activations,
              "ggufs": {k: v.name for k, v in ggufs.items()}, "versions": versions(),
              "batch_size": args.batch_size, "kv_budget_tokens": args.ctx, "max_seq_len": args.max_seq_len,
              "parts": args.parts, "long_tokens": args.long_tokens,
              "mixed": {k: getattr(args, f"mixed_{k}") for k in ("streams", "output", "prompt", "arrivals", "every_s")},
              "llama_cpp": {k: v for k, v in build.items() if k != "binaries"}, **targets(runs, start, args),
              "start": start, "runs": runs}
    write_json(f"{args.out}.json", result)
    write_json("scale.json", summary())
    plot(result, RESULTS / f"{args.out}.png")
    write_section(args.out, markdown(result, " ".join(sys.argv[1:])))


def summary() -> dict:
    """Every model's targets side by side (each from its own scale_<model>.json, with its CPU)."""
    out: dict = {"models": {}}
    for path in sorted(RESULTS.glob("scale_*.json")):
        r = json.loads(path.read_text())
        out["models"][path.stem.removeprefix("scale_")] = {
            "file": path.name, "model": r["model"], "machine": r["versions"]["machine"],
            "cpu_profile": r["versions"]["cpu_profile"]}
        out |= {k: v for k, v in r.items() if isinstance(v, (int, float, bool)) and k not in SETTINGS}
    return out


SETTINGS = ("batch_size", "kv_budget_tokens", "max_seq_len")  # a result's numbers that are not targets
ACTIVATIONS = {"fine": "the default: x to about 15 bits in the integer products",
               "int8": "x rounded once to int8 per block of 32, as llama.cpp's Q8 activations are"}


def plot(r: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    first = next(iter(r["runs"]))
    panels = [p for p in ("throughput", "long", "mixed") if p in r["parts"]] + ["rss"]
    # squeeze=False: one panel (`--parts short`) is still a row of axes
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    for ax, panel in zip(axes[0], panels, strict=True):
        bars: dict[str, list[float]] = {}
        if panel == "throughput":
            labels = [f"{t} c{c}" for t in r["runs"] for c, _ in THROUGHPUT]
            for side in ("ours", "llama.cpp"):
                bars[side] = [r["runs"][t][side]["throughput"][str(c)]["output_tokens_per_s"] for t in r["runs"]
                              for c, _ in THROUGHPUT]
            ax.set_title("tokens/s", fontsize=9)
        elif panel == "long":
            labels = [f"{n} tokens" for n in r["long_tokens"]]
            for side in ("ours", "llama.cpp"):
                bars[side] = [r["runs"][first][side]["long"][str(n)]["ttft_s"] or 0 for n in r["long_tokens"]]
            ax.set_title(f"first token at 1 client (s), {first}", fontsize=9)
        elif panel == "mixed":
            labels = ["gap p50", "gap p99"]
            for side in ("ours", "llama.cpp"):
                streams = r["runs"][first][side]["mixed"]["streams"]
                bars[side] = [(streams["itl_p50_s"] or 0) * 1e3, (streams["itl_p99_s"] or 0) * 1e3]
            ax.set_title(f"{r['mixed']['streams']} streams while {r['mixed']['prompt']}-token prompts arrive (ms)", fontsize=9)
        else:
            labels = ["loaded", "after the load"]
            for side in ("ours", "llama.cpp"):
                bars[side] = [(rss(r["runs"][first][side], w) or 0) / 2**30 for w in ("loaded", "after")]
            ax.set_title(f"RSS (GiB), {r['kv_budget_tokens']} KV positions each, {first}", fontsize=9)
        for i, (side, values) in enumerate(bars.items()):
            ax.bar([j + i * 0.4 for j in range(len(values))], values, 0.4, label=side)
        ax.set_xticks([j + 0.2 for j in range(len(labels))], labels, fontsize=7)
        ax.legend(fontsize=7)
    fig.suptitle(f"{r['model']} int4: ours and llama-server ({r['llama_cpp']['commit']}) on the same files, "
                 f"{r['versions']['machine']} ({r['versions']['cpu_profile']})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _tok_s(c: int, s: dict) -> str:
    run = s["throughput"][str(c)]
    return (f"{run['output_tokens_per_s']:.2f} ({peer.fmt(run['ttft_p50_s'], 1e3, 0)}; "
            f"{peer.fmt(run['itl_p50_s'], 1e3, 0)} / {peer.fmt(run['itl_p99_s'], 1e3, 0)})")


def _long(n: int, s: dict) -> str:
    return f"{peer.fmt(s['long'][str(n)]['ttft_s'], 1, 2)} ({s['long'][str(n)]['prompt_tokens']})"


def _mixed(s: dict) -> str:
    streams = s["mixed"]["streams"]
    return f"{peer.fmt(streams['itl_p50_s'], 1e3, 1)} / {peer.fmt(streams['itl_p99_s'], 1e3, 1)}"


def columns(r: dict) -> list[tuple[str, Callable[[dict], str]]]:
    """The table's columns for the parts this run measured: (header, a side's cell)."""
    out: list[tuple[str, Callable[[dict], str]]] = []
    if "throughput" in r["parts"]:
        out += [(f"tok/s, {c} client{'s' if c > 1 else ''} (first token p50; gap p50 / p99, ms)", functools.partial(_tok_s, c))
                for c, _ in THROUGHPUT]
    if "short" in r["parts"]:
        out.append(("short prompt, first token p50 (ms)", lambda s: peer.fmt(s["short_c1"]["ttft_p50_s"], 1e3, 0)))
    if "long" in r["parts"]:
        out += [(f"~{n}-token prompt, first token s (tokens)", functools.partial(_long, n)) for n in r["long_tokens"]]
    if "mixed" in r["parts"]:
        out.append(("mixed load, streams' gap p50 / p99 (ms)", _mixed))
    out.append(("RSS loaded / after (GiB)", lambda s: f"{(rss(s, 'loaded') or 0) / 2**30:.2f} / {(rss(s, 'after') or 0) / 2**30:.2f}"))
    return out


def markdown(r: dict, argv: str) -> str:
    first = next(iter(r["runs"]))
    table = columns(r)
    rows = ["| type | server | " + " | ".join(h for h, _ in table) + " |", "|---" * (2 + len(table)) + "|"]
    for kind, pair in r["runs"].items():
        for side, s in pair.items():
            cells = []
            for _, cell in table:
                try:
                    cells.append(cell(s))
                except KeyError:  # a part this type did not run (the second type: tokens/s only)
                    cells.append("")
            rows.append(f"| {kind} | {side} | " + " | ".join(cells) + " |")
    keys = [k for k, v in r.items() if isinstance(v, (int, float, bool)) and k not in SETTINGS]
    cold, warm = r["start"]["cold"], r["start"]["warm"]
    return "\n".join([
        f"## The sizes users serve: {r['model']} (bench.scale)",
        "",
        f"`python -m bench.scale {argv}`: {r['model']}, int4 ({', '.join(r['ggufs'].values())}: ours and llama-server "
        f"serve the same files), ours' activations `{r.get('activations', 'fine')}` ({ACTIVATIONS[r.get('activations', 'fine')]}), "
        f"{r['batch_size']} slots sharing {r['kv_budget_tokens']} KV positions (ours `kv_tokens`, "
        f"llama-server `-c` with `--kv-unified`), ours' `max_seq_len` {r['max_seq_len']}; {r['versions']['machine']}, "
        f"{r['versions']['cpu_profile']}, {r['versions']['threads']} threads. Tokens/s: {THROUGHPUT[0][1]} requests at 1 "
        f"client, {THROUGHPUT[1][1]} at 16, {r.get('output_tokens', 32)} tokens each; the other parts on {first}."
        + (f" The mixed load: {r['mixed']['streams']} streams of {r['mixed']['output']} tokens while a "
           f"{r['mixed']['prompt']}-token prompt arrives every {r['mixed']['every_s']} s ({r['mixed']['arrivals']} times)."
           if "mixed" in r["parts"] else ""),
        "",
        *rows,
        "",
        f"Ours' start on {first} (a compile cache of the run's own): cold, the worker READY after "
        f"{cold['since_start_s']['ready']:.1f} s and the compiled steps served after {cold['since_start_s']['compiled']:.1f} s "
        f"(compiled in the background in {peer.fmt(cold['compiled_after_s'], 1, 1)} s); the warm restart READY after "
        f"{warm['since_start_s']['ready']:.1f} s, compiled after {warm['since_start_s']['compiled']:.1f} s.",
        "",
        "Targets: " + ", ".join(f"`{k}` {r[k]:.2f}" if isinstance(r[k], float) else f"`{k}` {r[k]}" for k in keys),
        "",
        f"![scale](results/scale_{r['out']}.png)",
    ])


if __name__ == "__main__":
    main()
