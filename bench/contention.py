"""On a shared CPU (issue 58): ours and llama-server on the same int4 file, each quiet, then beside
one single-threaded busy process at nice 0 and at nice 19, then beside the sidecar polling the
metadata emulator as in the pod; ours also as the code before issue 58 (`threading: openmp`, every
loop in torch's libgomp team, with libgomp's default wait, GOMP_SPINCOUNT=300000), in the same run.

    .venv/bin/python -m bench.contention                  # the default model, 1 and 16 clients
    .venv/bin/python -m bench.contention --model 1b       # the Llama-3.2-1B body (docs/results/contention_1b.json)

Every server runs in a session of its own, as TorchServe's launcher starts it and as a container
runs in a cgroup of its own, and so does the busy process. Linux's scheduler shares the cores
between sessions (autogroup) and cgroups first, so a process's nice ranks it only inside its own
session: a plain `nice -n 19` neighbour in another session takes a whole core, as one at nice 0
does. So here the busy process's session gets its nice too (/proc/PID/autogroup): `nice19` is a
low-priority neighbour (as a BestEffort pod is, by cgroup weight), `nice0` an equal one that takes
a core. A peer started in the busy process's own session would see its nice and ours not: unequal.

Each condition measures every server in turn (1 client, then 16) after a warm-up: the servers
take turns `--rounds` times (bench.peer.turns: the order reversed every other round) and each
level pools its rounds. `quiet_over_before` and `nice19_over_quiet` compare runs of about the same
speed, and one round each, minutes apart, measured the host's drift as much as the code (a 0.91 on
a Zen 3 whose same servers ran a third faster minutes later). Beside the nice-0 process, one round:
the code before issue 58 makes a token a second there. Tokens/s, first token and the client-side gap
between tokens p50/p99 are recorded, and each side's RSS. Writes docs/results/contention.json (+ raw
records), docs/results/contention.png and the contention section of docs/benchmarks.md.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from bench import peer, peer_llamacpp as llamacpp, peer_models
from bench.common import RESULTS, versions, write_json, write_section
from bench.load import run_load
from handler.engine.kernels import threads
from handler.packing.model_config import ServingOptions

CONDITIONS = ("quiet", "nice19", "nice0", "sidecar")
# The issue's busy process, `while True: pass`, killed with this process (Linux's PR_SET_PDEATHSIG,
# 1): in a session of its own, it outlived a bench stopped with a signal, and slowed every run after.
BUSY = "import ctypes, signal\nctypes.CDLL(None).prctl(1, signal.SIGKILL)\nwhile True: pass"
BEFORE_SPIN = str(threads.LIBGOMP_DEFAULT)  # the code before issue 58 started workers with libgomp's default
BEFORE = ["threading=openmp"]  # ...and ran the products in torch's OpenMP team
LLAMACPP_TYPE = "Q4_0"  # llama.cpp's fastest 4-bit type on x86 (bench.peer's runs)


def parse_args(argv: list[str] | None = None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=list(peer_models.MODELS), default="default")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    p.add_argument("--requests", type=int, nargs="+", default=[12, 48])
    p.add_argument("--conditions", nargs="+", choices=CONDITIONS, default=list(CONDITIONS))
    p.add_argument("--before-conditions", nargs="+", choices=CONDITIONS, default=["quiet", "nice0"],
                   help="the conditions the code before issue 58 runs in (slow beside a busy process)")
    p.add_argument("--before-requests", type=int, nargs="+", default=[3, 16],
                   help="its requests per level beside a busy process (tokens come seconds apart there)")
    p.add_argument("--rounds", type=int, default=4, help="turns each server takes per level (beside nice 0: one)")
    p.add_argument("--warmup-s", type=float, default=30)
    p.add_argument("--output-tokens", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--max-seq-len", type=int, default=512)
    p.add_argument("--ctx", type=int, default=16384, help="llama-server's -c (shared by its slots)")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="llama-server's -t/-tb; build jobs")
    args = p.parse_args(argv)
    args.out = "contention" if args.model == "default" else f"contention_{args.model}"
    # what bench.peer's servers read
    args.batching, args.handler_set, args.systems = "continuous", [], list(peer.SYSTEMS)
    args.max_batch_delay_ms = ServingOptions.max_batch_delay_ms
    return args


@contextlib.contextmanager
def disturbance(condition: str, ours_ts) -> Iterator[None]:
    """What shares the cores during `condition`, in a session of its own."""
    if condition in ("nice0", "nice19"):
        nice = condition.removeprefix("nice")
        proc = subprocess.Popen(["nice", "-n", nice, sys.executable, "-c", BUSY], start_new_session=True)
        autogroup = Path(f"/proc/{proc.pid}/autogroup")
        if autogroup.exists():
            autogroup.write_text(nice)  # the session's share too: what low priority means across sessions
        try:
            time.sleep(1)
            yield
        finally:
            proc.kill()
            proc.wait()
    elif condition == "sidecar":
        yield from _sidecar(ours_ts)
    else:
        yield


def _sidecar(ts) -> Iterator[None]:
    from bench.chaos.replica import start_sidecar
    from handler.testing.metadata_emulator import MetadataEmulator

    emulator = MetadataEmulator().start()
    with tempfile.TemporaryDirectory() as work:
        sidecar = start_sidecar(Path(work), ts, {"clouds": "aws", "aws_metadata_url": emulator.url})
        try:
            yield
        finally:
            sidecar.process.kill()
            sidecar.process.wait()
            emulator.stop()


def measure(servers: dict[str, peer.Server], condition: str, args) -> dict[str, list[dict]]:
    """Each server's runs in `condition`, a summary a level over its pooled rounds, the servers
    taking turns (`--rounds` turns each; beside the nice-0 process one)."""
    keys = [key for key in servers if key != "ours_before" or condition in args.before_conditions]
    rounds = 1 if condition == "nice0" else args.rounds
    before_requests = dict(zip(args.concurrency, args.before_requests, strict=True))
    loads: dict[str, dict[int, list]] = {key: {c: [] for c in args.concurrency} for key in keys}
    for c, n, key in peer.turns(keys, args.concurrency, args.requests, rounds):
        if key == "ours_before" and condition != "quiet":  # tokens come seconds apart there
            n = before_requests[c]
        headers = {**servers[key].headers, "Connection": "close"}
        loads[key][c].append(run_load(servers[key].url, headers, peer.bodies(n, args), c, stream=True))
    return {key: [peer.level_summary((key, condition), c, one, args) for c, one in levels.items()]
            for key, levels in loads.items()}


def main() -> None:
    args = parse_args()
    build = llamacpp.ensure_built(args.threads)
    model = peer_models.MODELS[args.model]
    checkpoint = peer_models.checkpoint(model)
    ggufs = peer_models.ggufs(model, build, checkpoint, [LLAMACPP_TYPE])
    gguf = ggufs[LLAMACPP_TYPE]
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        servers = {
            "ours": stack.enter_context(peer.ours_server("int4", checkpoint, gguf, args, Path(tmp))),
            "ours_before": stack.enter_context(peer.ours_server("int4", checkpoint, gguf, before_args(args), Path(tmp),
                                                                env={"GOMP_SPINCOUNT": BEFORE_SPIN}, name="before")),
            "llama.cpp": stack.enter_context(peer.llamacpp_server(LLAMACPP_TYPE, build, gguf, args, Path(tmp))),
        }
        for key, server in servers.items():
            headers = {**server.headers, "Connection": "close"}
            peer.warm_up(functools.partial(run_load, server.url, headers, peer.bodies(peer.WARMUP_BATCH, args), 1,
                                           stream=True), args.warmup_s)
            results[key] = {"conditions": {}}
        for condition in args.conditions:
            with disturbance(condition, servers["ours"].torchserve):
                for key, runs in measure(servers, condition, args).items():
                    results[key]["conditions"][condition] = runs
        for key, server in servers.items():
            results[key]["side"] = server.describe()  # RSS after the runs
    result = {"model": model.name, "gguf": gguf.name, "output_tokens": args.output_tokens, "versions": versions(),
              "batch_size": args.batch_size, "concurrency": args.concurrency, "requests": args.requests,
              "warmup_s": args.warmup_s, "rounds": args.rounds, "llama_server_ctx": args.ctx,
              "spin_count": threads.SPIN_COUNT,
              "before_spin_count": int(BEFORE_SPIN), "llama_cpp": {k: v for k, v in build.items() if k != "binaries"},
              **targets(results, args.concurrency, "" if args.model == "default" else "b1_"),
              "sides": results}
    write_json(f"{args.out}.json", result)
    plot(result, RESULTS / f"{args.out}.png")
    write_section(args.out, markdown(result, " ".join(sys.argv[1:])))


def before_args(args):
    """bench.peer's arguments for the code before issue 58: ours with `threading: openmp`."""
    return argparse.Namespace(**{**vars(args), "handler_set": [*args.handler_set, *BEFORE]})


def run_at(results: dict, key: str, condition: str, c: int) -> dict | None:
    runs = (results.get(key) or {}).get("conditions", {}).get(condition) or []
    return next((r for r in runs if r["concurrency"] == c), None)


def targets(results: dict, concurrency: list[int], prefix: str) -> dict:
    """Issue 58's keys (None where a side is missing): ours beside a nice-19 process over ours quiet;
    ours over llama.cpp beside a nice-0 process; ours' gap p99 over llama.cpp's there; ours quiet
    over the code before, quiet."""
    out = {}
    for c in concurrency:
        ours_quiet = run_at(results, "ours", "quiet", c)
        out[f"{prefix}nice19_over_quiet_c{c}"] = peer.ratio_of(run_at(results, "ours", "nice19", c), ours_quiet, "output_tokens_per_s")
        out[f"{prefix}nice0_ratio_vs_llamacpp_c{c}"] = peer.ratio_of(run_at(results, "ours", "nice0", c),
                                                              run_at(results, "llama.cpp", "nice0", c), "output_tokens_per_s")
        out[f"{prefix}nice0_itl_p99_ratio_c{c}"] = peer.ratio_of(run_at(results, "ours", "nice0", c),
                                                          run_at(results, "llama.cpp", "nice0", c), "itl_p99_s")
        out[f"{prefix}quiet_over_before_c{c}"] = peer.ratio_of(ours_quiet, run_at(results, "ours_before", "quiet", c),
                                                        "output_tokens_per_s")
    return out


def plot(r: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(r["concurrency"]) * 2, figsize=(16, 4))
    conditions = [c for c in CONDITIONS if any(c in side["conditions"] for side in r["sides"].values())]
    width = 0.8 / len(r["sides"])
    for col, c in enumerate(r["concurrency"]):
        for panel, (key, label, scale) in enumerate((("output_tokens_per_s", "output tokens/s", 1),
                                                      ("itl_p99_s", "gap between tokens p99 (ms)", 1e3))):
            ax = axes[col * 2 + panel]
            for i, side in enumerate(r["sides"]):
                values = [(run_at(r["sides"], side, cond, c) or {}).get(key) for cond in conditions]
                xs = [j + i * width for j, v in enumerate(values) if v is not None]
                ax.bar(xs, [v * scale for v in values if v is not None], width, label=side, color=f"C{i}")
            ax.set_xticks([j + width for j in range(len(conditions))], conditions)
            ax.set_title(f"{c} client{'s' if c > 1 else ''}: {label}", fontsize=9)
            if panel:
                ax.set_yscale("log")
            ax.legend(fontsize=7)
    fig.suptitle(f"{r['model']} int4 ({r['gguf']}) on a shared CPU: ours and llama-server ({r['llama_cpp']['commit']}), "
                 f"{r['versions']['machine']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def markdown(r: dict, argv: str) -> str:
    rows = []
    for side in r["sides"]:
        for cond in CONDITIONS:
            for c in r["concurrency"]:
                run = run_at(r["sides"], side, cond, c)
                if run:
                    rows.append(f"| {side} | {cond} | {c} | {peer.fmt(run['output_tokens_per_s'], 1, 1)} | "
                                f"{peer.fmt(run['ttft_p50_s'], 1e3, 0)} | {peer.fmt(run['itl_p50_s'], 1e3, 1)} | "
                                f"{peer.fmt(run['itl_p99_s'], 1e3, 1)} |")
    keys = [k for k in r if k.endswith(tuple(f"_c{c}" for c in r["concurrency"])) and r[k] is not None]
    rss = "; ".join(f"{side} {(s['side'].get('worker_rss_bytes') or s['side'].get('rss_bytes') or 0) / 2**30:.2f} GiB"
                    for side, s in r["sides"].items())
    return "\n".join([
        f"## On a shared CPU: {r['model']} beside a busy process (bench.contention)",
        "",
        f"`python -m bench.contention {argv}`: {r['model']}, int4 ({r['gguf']}: ours and llama-server serve the "
        f"same file), {r['output_tokens']} tokens a request, greedy, {r['batch_size']} slots; "
        f"{r['versions']['machine']}. Ours runs its products in the kernels' own pool (`threading: pool`, torch's ops "
        f"on one thread, GOMP_SPINCOUNT={r['spin_count']}); `ours_before` is the code before issue 58: "
        f"`threading: openmp` with libgomp's default wait ({r['before_spin_count']}). RSS after the run: {rss}.",
        "",
        "| server | beside | clients | tok/s | first token p50 (ms) | gap p50 (ms) | gap p99 (ms) |",
        "|---|---|---|---|---|---|---|",
        *rows,
        "",
        "Ratios: " + ", ".join(f"`{k}` {r[k]:.2f}" for k in keys),
    ])


if __name__ == "__main__":
    main()
