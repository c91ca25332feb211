"""Soak run: the default .mar under a long mixed load, then what it leaked.

    .venv/bin/python -m bench.soak [--duration-s 600] [--clients 16] [--compile eager]

A real TorchServe (token auth on) serves the default model, compiled (it waits until compiled
speed arrived, so the eager-to-compiled switch is not counted as growth). 16 closed-loop clients
send streamed, whole, OpenAI chat, malformed and disconnect-mid-stream requests
(bench/soak_kinds.py, sent by bench/load.py) for the duration. The worker's RSS is sampled throughout; after a warm-up
the first sample is the baseline, and the last is taken once the load stopped. Then one probe
request runs and the handler's `ts_llm_requests_running` gauge must read 0: a slot still held by
a finished, cut or abandoned request is a leak.

Writes docs/results/soak.json (`server_errors`, `rss_growth_fraction`, `slots_leaked`,
`requests`), docs/results/soak.png and the soak section of docs/benchmarks.md.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import psutil
import requests

from bench.common import REPO, RESULTS, versions, write_json, write_section
from bench.load import ClosedLoop
from bench.soak_kinds import KINDS, Api, sender
from handler.engine.convert import ensure_default_checkpoint
from handler.packing.archive import build_mar
from handler.packing.model_config import ServingOptions
from handler.torchserve.launch import Ports, TorchServe, start_torchserve

MODEL = "llm"
CHECKPOINT = REPO / "artifacts" / "checkpoints" / "smollm2-135m-instruct"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration-s", type=float, default=600.0, help="load duration (the run is bounded by it)")
    p.add_argument("--warmup-s", type=float, default=60.0, help="load before the RSS baseline is taken")
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--compile", choices=["default", "eager"], default="default",
                   help="default: the .mar archive.sh builds (compiled); eager: skip the compile")
    p.add_argument("--sample-s", type=float, default=5.0, help="RSS sampling interval")
    return p.parse_args()


def main() -> int:
    args = parse_args()
    checkpoint = ensure_default_checkpoint(CHECKPOINT)
    handler = {"compile": "eager"} if args.compile == "eager" else {}
    with tempfile.TemporaryDirectory(prefix="ts-llm-soak-") as tmp:
        store = Path(tmp) / "model_store"
        build_mar(checkpoint, MODEL, store, ServingOptions(handler=handler))
        ts = start_torchserve(store, {MODEL: f"{MODEL}.mar"}, REPO / "config.properties", Path(tmp) / "work", Ports.free())
        try:
            ts.wait_ready(MODEL, timeout=1800)
            if args.compile == "default":
                ts.wait_compiled(MODEL, time.monotonic() + 1800)
            results = soak(args, ts)
        finally:
            ts.stop()
    write_json("soak.json", results)
    plot(results, RESULTS / "soak.png")
    write_section("soak", markdown(results))
    print(f"soak: requests={results['requests']} server_errors={results['server_errors']} "
          f"rss_growth_fraction={results['rss_growth_fraction']:.4f} slots_leaked={results['slots_leaked']}")
    return 0 if results["server_errors"] == 0 and results["slots_leaked"] == 0 and results["not_refused"] == 0 else 1


def soak(args: argparse.Namespace, ts: TorchServe) -> dict:
    worker = psutil.Process(worker_pid(ts))
    api = Api(f"{ts.inference_url}/predictions/{MODEL}", ts.headers())
    t0 = time.time()
    load = ClosedLoop(args.clients, sender(api)).start()
    rss = []  # [seconds since start, bytes]
    while time.time() - t0 < args.duration_s:
        rss.append([round(time.time() - t0, 1), worker.memory_info().rss])
        time.sleep(args.sample_s)
    load.stop(timeout_s=180)
    results = load.snapshot()
    time.sleep(2.0)
    rss.append([round(time.time() - t0, 1), worker.memory_info().rss])
    running = running_after_probe(ts, api)
    baseline = next(b for s, b in rss if s >= args.warmup_s)
    errors = [r for r in results if r.outcome == "server_error"]
    return {
        "command": ".venv/bin/python -m bench.soak" + (f" --compile {args.compile}" if args.compile != "default" else ""),
        "versions": versions(), "compile": args.compile, "clients": args.clients,
        "duration_s": args.duration_s, "warmup_s": args.warmup_s, "kind_weights": KINDS,
        "requests": len(results),
        "by_kind": {kind: dict(Counter(r.outcome for r in results if r.kind == kind)) for kind in KINDS},
        "server_errors": len(errors),
        "server_error_samples": sorted({f"{r.kind}: {r.status} {r.error}"[:200] for r in errors})[:8],
        "not_refused": sum(1 for r in results if r.outcome == "not_refused"),
        "malformed_statuses": dict(Counter(f"{r.status} {r.error}" for r in results if r.kind == "malformed")),
        "worker_pid_unchanged": worker.is_running() and worker.pid == worker_pid(ts),
        "rss_baseline_bytes": baseline, "rss_end_bytes": rss[-1][1],
        "rss_growth_fraction": rss[-1][1] / baseline - 1, "rss_samples": rss,
        "slots_leaked": running,
    }


def worker_pid(ts: TorchServe) -> int:
    (worker,) = ts.client(MODEL).describe().workers
    return worker.process()


def running_after_probe(ts: TorchServe, api: Api) -> int:
    """The handler's running-requests gauge after one more request ran to its end: a cut or
    abandoned request still holding a slot shows here (the probe's own step frees its slot)."""
    r = requests.post(api.url, json={"prompt": "Hi", "max_new_tokens": 2}, headers=api.headers, timeout=120)
    r.raise_for_status()
    time.sleep(3.0)  # backend metrics reach the frontend through the worker's log
    text = requests.get(f"{ts.metrics_url}/metrics", timeout=10).text
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("ts_llm_requests_running{")]
    if not values:
        raise RuntimeError("ts_llm_requests_running is not on TorchServe's metrics endpoint")
    return int(sum(values))


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seconds, rss = zip(*results["rss_samples"])
    fig, ax = plt.subplots(figsize=(9, 4))
    ax.plot(seconds, [b / 2**20 for b in rss], label="model worker RSS")
    ax.axvline(results["warmup_s"], color="tab:gray", linestyle=":", label="baseline (end of warm-up)")
    ax.set_xlabel("seconds")
    ax.set_ylabel("MiB")
    ax.set_title(f"Soak: {results['requests']} requests, {results['server_errors']} server errors, "
                 f"RSS {results['rss_growth_fraction']:+.1%} after warm-up, {results['slots_leaked']} slots leaked")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def markdown(r: dict) -> str:
    v = r["versions"]
    rows = "\n".join(f"| {kind} | {sum(c.values())} | {c.get('ok', 0)} | {c.get('server_error', 0)} | "
                     f"{c.get('not_refused', 0)} |" for kind, c in r["by_kind"].items())
    samples = "\n".join(f"- `{s}`" for s in r["server_error_samples"]) or "- none"
    return f"""## Soak

Command: `{r['command']}` ({r['duration_s']:.0f} s, {r['clients']} closed-loop clients). {v['machine']},
CPU profile {v['cpu_profile']}, torch {v['torch']}, torchserve {v.get('torchserve')}; the default `.mar`
({'compiled' if r['compile'] == 'default' else 'eager'}), token auth on. Each request is streamed (native),
whole (native), OpenAI chat (streamed), malformed (must get a 4xx) or abandoned mid-stream by its client
(`bench/soak_kinds.py`).

| kind | sent | ok | server errors | malformed not refused |
|---|---|---|---|---|
{rows}

**server_errors {r['server_errors']}**, **rss_growth_fraction {r['rss_growth_fraction']:+.4f}** (model worker
RSS {r['rss_baseline_bytes'] / 2**20:.0f} MiB after the {r['warmup_s']:.0f} s warm-up, {r['rss_end_bytes'] / 2**20:.0f} MiB
at the end), **slots_leaked {r['slots_leaked']}** (`ts_llm_requests_running` after a last probe request),
{r['requests']} requests; the worker kept its pid: {r['worker_pid_unchanged']}. Server errors seen:

{samples}

![soak](results/soak.png)
"""


if __name__ == "__main__":
    sys.exit(main())
