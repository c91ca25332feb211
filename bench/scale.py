"""The sizes users serve (issue 59): long prompts and a long context on the 1B body, ours and
llama-server on the same Q4_0 file with the same KV budget: ours `kv_tokens`, llama-server's `-c`
as one pool (--kv-unified), both 16 slots.

- The first token at one client for prompts of about 1k, 4k and 16k tokens (each new to both
  prompt caches: words drawn with a seed of its own), and for a short prompt.
- A mixed load: streams decoding while a 4k-token prompt arrives every few seconds; the decoding
  streams' gap between tokens p50/p99, and the long prompts' first token under that load.
- Each server's RSS after loading and after the load.

    .venv/bin/python -m bench.scale

Writes docs/results/scale.json (+ raw records), docs/results/scale.png and the scale section of
docs/benchmarks.md. Speed does not depend on the weights' values, so the random 1B body stands in
for a trained one (ignore_eos: every answer runs its length).
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import os
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench import peer, peer_llamacpp as llamacpp, peer_models
from bench.common import RESULTS, versions, write_json, write_section
from bench.load import Record, run_load, summarize
from handler.engine.tokenizer import Tokenizer
from handler.packing.model_config import ServingOptions

LLAMACPP_TYPE = "Q4_0"
WORDS = ("river", "stone", "light", "paper", "garden", "window", "quiet", "market", "winter", "signal", "forest",
         "letter", "bridge", "silver", "engine", "harbor", "orange", "pocket", "meadow", "thunder", "candle",
         "island", "mirror", "velvet", "ladder", "rocket", "shadow", "canvas", "copper", "lantern", "valley")


def parse_args(argv: list[str] | None = None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=list(peer_models.MODELS), default="1b")
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
    args = p.parse_args(argv)
    args.out = "scale"
    # what bench.peer's servers read
    args.batching, args.handler_set, args.systems = "continuous", [f"kv_tokens={args.ctx}"], list(peer.SYSTEMS)
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


def measure(server: peer.Server, tok: Tokenizer, args) -> dict:
    loaded = server.describe()
    short = summarize(run_load(server.url, {**server.headers, "Connection": "close"},
                               peer.bodies(args.short_requests, args), 1, stream=True))
    print(f"  short prompt at 1 client: first token p50 {peer.fmt(short['ttft_p50_s'], 1e3, 0)} ms", flush=True)
    return {"loaded": loaded, "short_c1": short, "long": long_prompts(server, tok, args), "mixed": mixed(server, tok, args),
            "after": server.describe()}


def rss(side: dict, when: str) -> int | None:
    d = side[when]
    return d.get("worker_rss_bytes") or d.get("rss_bytes")


def targets(sides: dict, args) -> dict:
    ours, theirs = sides["ours"], sides["llama.cpp"]

    def ratio(a, b):
        return a / b if a is not None and b else None

    out = {f"ttft_{n // 1000}k_ratio_1b": ratio(ours["long"][str(n)]["ttft_s"], theirs["long"][str(n)]["ttft_s"])
           for n in args.long_tokens}
    out["ttft_short_ratio_c1_1b"] = ratio(ours["short_c1"]["ttft_p50_s"], theirs["short_c1"]["ttft_p50_s"])
    out["mixed_itl_p99_ratio"] = ratio(ours["mixed"]["streams"]["itl_p99_s"], theirs["mixed"]["streams"]["itl_p99_s"])
    out["mixed_itl_p50_ratio"] = ratio(ours["mixed"]["streams"]["itl_p50_s"], theirs["mixed"]["streams"]["itl_p50_s"])
    out["rss_ratio_1b"] = ratio(rss(ours, "after"), rss(theirs, "after"))
    longest = str(max(args.long_tokens))
    out["context_16k_served"] = ours["long"][longest]["status"] == 200 and ours["long"][longest]["prompt_tokens"] >= 15000
    return out


def main() -> None:
    args = parse_args()
    build = llamacpp.ensure_built(args.threads)
    model = peer_models.MODELS[args.model]
    checkpoint = peer_models.checkpoint(model)
    gguf = peer_models.ggufs(model, build, checkpoint, [LLAMACPP_TYPE])[LLAMACPP_TYPE]
    tok = Tokenizer.from_dir(checkpoint)
    sides: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for key, start in (("ours", functools.partial(peer.ours_server, "int4", checkpoint, gguf)),
                           ("llama.cpp", functools.partial(peer.llamacpp_server, LLAMACPP_TYPE, build, gguf))):
            with contextlib.ExitStack() as stack:
                server = stack.enter_context(start(args, Path(tmp)))
                headers = {**server.headers, "Connection": "close"}
                peer.warm_up(functools.partial(run_load, server.url, headers, peer.bodies(peer.WARMUP_BATCH, args), 1,
                                               stream=True), args.warmup_s)
                print(key, flush=True)
                sides[key] = measure(server, tok, args)
    result = {"model": model.name, "gguf": gguf.name, "versions": versions(), "batch_size": args.batch_size,
              "kv_budget_tokens": args.ctx, "max_seq_len": args.max_seq_len, "long_tokens": args.long_tokens,
              "mixed": {k: getattr(args, f"mixed_{k}") for k in ("streams", "output", "prompt", "arrivals", "every_s")},
              "llama_cpp": {k: v for k, v in build.items() if k != "binaries"}, **targets(sides, args), "sides": sides}
    write_json(f"{args.out}.json", result)
    plot(result, RESULTS / f"{args.out}.png")
    write_section(args.out, markdown(result, " ".join(sys.argv[1:])))


def plot(r: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, middle, right) = plt.subplots(1, 3, figsize=(15, 4))
    lengths = [str(n) for n in r["long_tokens"]]
    for i, side in enumerate(r["sides"]):
        s = r["sides"][side]
        left.bar([j + i * 0.4 for j in range(len(lengths))], [s["long"][n]["ttft_s"] or 0 for n in lengths], 0.4, label=side)
        streams = s["mixed"]["streams"]
        middle.bar([i * 0.4, 1 + i * 0.4], [(streams["itl_p50_s"] or 0) * 1e3, (streams["itl_p99_s"] or 0) * 1e3], 0.4,
                   label=side)
        right.bar([i * 0.4, 1 + i * 0.4], [(rss(s, "loaded") or 0) / 2**30, (rss(s, "after") or 0) / 2**30], 0.4, label=side)
    left.set_xticks([j + 0.2 for j in range(len(lengths))], [f"{n} tokens" for n in lengths])
    left.set_title("first token at 1 client (s)", fontsize=9)
    middle.set_xticks([0.2, 1.2], ["gap p50", "gap p99"])
    middle.set_title(f"{r['mixed']['streams']} streams while {r['mixed']['prompt']}-token prompts arrive (ms)", fontsize=9)
    right.set_xticks([0.2, 1.2], ["loaded", "after the load"])
    right.set_title(f"RSS (GiB), {r['kv_budget_tokens']} KV positions each", fontsize=9)
    for ax in (left, middle, right):
        ax.legend(fontsize=7)
    fig.suptitle(f"{r['model']} int4 ({r['gguf']}): ours and llama-server ({r['llama_cpp']['commit']}), "
                 f"{r['versions']['machine']} ({r['versions']['cpu_profile']})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def markdown(r: dict, argv: str) -> str:
    rows = []
    for side, s in r["sides"].items():
        long = " | ".join(f"{peer.fmt(s['long'][str(n)]['ttft_s'], 1, 2)} ({s['long'][str(n)]['prompt_tokens']})"
                          for n in r["long_tokens"])
        streams = s["mixed"]["streams"]
        rows.append(f"| {side} | {peer.fmt(s['short_c1']['ttft_p50_s'], 1e3, 0)} | {long} | "
                    f"{peer.fmt(streams['itl_p50_s'], 1e3, 1)} / {peer.fmt(streams['itl_p99_s'], 1e3, 1)} | "
                    f"{(rss(s, 'loaded') or 0) / 2**30:.2f} / {(rss(s, 'after') or 0) / 2**30:.2f} |")
    keys = [k for k in r if k.endswith(("_1b", "_ratio", "_served"))]
    return "\n".join([
        f"## The sizes users serve: long prompts and a long context, {r['model']} (bench.scale)",
        "",
        f"`python -m bench.scale {argv}`: {r['model']}, int4 ({r['gguf']}: ours and llama-server serve the same file), "
        f"{r['batch_size']} slots sharing {r['kv_budget_tokens']} KV positions (ours `kv_tokens`, llama-server `-c` with "
        f"`--kv-unified`), ours' `max_seq_len` {r['max_seq_len']}; {r['versions']['machine']}, "
        f"{r['versions']['cpu_profile']}. The mixed load: {r['mixed']['streams']} streams of {r['mixed']['output']} tokens "
        f"while a {r['mixed']['prompt']}-token prompt arrives every {r['mixed']['every_s']} s ({r['mixed']['arrivals']} times).",
        "",
        "| server | short prompt, first token p50 (ms) | " + " | ".join(f"~{n}-token prompt, first token s (tokens)"
                                                                      for n in r["long_tokens"])
        + " | mixed load, streams' gap p50 / p99 (ms) | RSS loaded / after (GiB) |",
        "|---" * (4 + len(r["long_tokens"])) + "|",
        *rows,
        "",
        "Targets: " + ", ".join(f"`{k}` {r[k]:.2f}" if isinstance(r[k], float) else f"`{k}` {r[k]}" for k in keys),
        "",
        "![scale](results/scale.png)",
    ])


if __name__ == "__main__":
    main()
