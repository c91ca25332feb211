"""Which storage/compute path is fastest on this CPU profile: the measurements behind
`dtype: auto` and `packed_weights: auto` (handler/engine/platform.py).

    .venv/bin/python -m bench.paths                      # this CPU's own profile
    .venv/bin/python -m bench.paths --cpu-profile avx2   # a lower profile this CPU can run

Two parts, on the default model's real weights, 2 threads unless --threads:
- several rows (batched decode, prefill): one pass through all 211 projections (30 layers x
  q/k/v, o, gate/up, down + the output head) at 1..128 rows, for each way this profile can run
  them: plain bf16 or float32 `F.linear`, oneDNN-packed bf16 or float32 copies, and bf16 weights
  through our kernel (ts_llm::bf16_linear: decode batches take it over a float32 copy);
- one row (batch-1 decode): a `torch.compile`d decode step with bf16 weights through our
  matrix-vector kernel and through Inductor's reduction, and with float32 weights.

Writes docs/results/paths.json (`profiles.<name>`: the latest run of each profile) and
docs/results/paths.png, and the "Per CPU profile" section of docs/benchmarks.md.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from bench.common import RESULTS, best_seconds, previous_profiles, profile_heading, versions, write_json, write_section
from handler.engine import platform
from handler.engine.checkpoint import load_model, open_checkpoint
from handler.engine.compiled import aot
from handler.engine.convert import ensure_default_checkpoint
from handler.engine.kernels import build, matvec
from handler.engine.kv.pages import own_pages, page_columns
from handler.engine.model import packed
from handler.engine.model.linear import Linear

ROWS = (1, 2, 4, 8, 16, 32, 128)
REPEATS = 5  # every time is the best of this many


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cpu-profile", metavar="NAME", help="run under this CPU profile (python -m handler.engine.platform)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rows", type=int, nargs="+", default=list(ROWS))
    return p.parse_args()


def projection_options(plat: platform.Platform) -> dict[str, tuple[str, str]]:
    """name -> (weights dtype, packing) for every option this profile can run."""
    options: dict[str, tuple[str, str]] = {}
    paths: tuple[tuple[platform.Dtype, platform.Packing], ...] = (
        ("bfloat16", "off"), ("float32", "off"), ("bfloat16", "bfloat16"), ("bfloat16", "float32"), ("float32", "float32"))
    for dtype, packing in paths:
        try:
            platform.choose_path(plat, "cpu", dtype, packing)
        except platform.PlatformError:
            continue
        options[f"{dtype} weights, " + ("plain" if packing == "off" else f"packed {packing}")] = (dtype, packing)
    options["bfloat16 weights, our kernel"] = ("bfloat16", "kernel")
    return options


def projections_ms(weights: list[torch.Tensor], dtype: str, packing: str, rows: int) -> float:
    """One pass through every projection at `rows` rows, activations in `dtype`, in ms."""
    ws = [w.to(getattr(torch, dtype)) for w in weights]
    if packing not in ("off", "kernel"):
        for w in ws:
            packed.pack(w, getattr(torch, packing))
    linear = {"off": F.linear, "kernel": matvec.bf16_linear}.get(packing, packed.packed_linear)
    inputs = {k: torch.randn(rows, k).to(getattr(torch, dtype)) for k in {w.shape[1] for w in ws}}

    def step():
        for w in ws:
            linear(inputs[w.shape[1]], w)

    with torch.no_grad():
        step()  # warm-up: oneDNN builds its kernels on first use
        return 1e3 * best_seconds(step, "cpu", REPEATS)


# one-row routes of a compiled batch-1 decode step: weights' dtype, and whether single rows call
# our kernel (ts_llm::bf16_linear, what the engine compiles with bf16 weights) or Inductor's reduction
DECODE_ROUTES = {"bfloat16, our matvec kernel": ("bfloat16", True), "bfloat16, Inductor's reduction": ("bfloat16", False),
                 "float32, Inductor's reduction": ("float32", False)}


def decode_tokens_per_s(checkpoint: Path, dtype: str, use_kernel: bool) -> tuple[float, float]:
    """A compiled batch-1 decode step with `dtype` weights (no packing: one row): tokens/s and
    the compile seconds."""
    model = load_model(open_checkpoint(checkpoint), getattr(torch, dtype), "cpu")
    if use_kernel:
        build.load()
        model.use_matvec()
    model.setup_cache(page_columns(256), 256)
    step = torch.compile(model.decode, fullgraph=True, dynamic=False)
    token, pages, pos = torch.zeros(1, dtype=torch.long), own_pages(1, 256), torch.tensor([60])
    with torch.no_grad(), aot.trace_settings():
        start = time.perf_counter()
        step(token, pages, pos, 64)
        compile_s = time.perf_counter() - start
        per_step = best_seconds(lambda: [step(token, pages, pos, 64) for _ in range(10)], "cpu", REPEATS) / 10
    torch._dynamo.reset()
    return 1 / per_step, compile_s


def main() -> None:
    args = parse_args()
    platform.reexec_under(args.cpu_profile)
    torch.set_num_threads(args.threads)
    plat = platform.current()
    checkpoint = ensure_default_checkpoint(Path("artifacts/checkpoints/smollm2-135m-instruct"))
    model = load_model(open_checkpoint(checkpoint), torch.float32, "cpu")
    weights = [m.weight.detach() for m in model.modules() if isinstance(m, Linear)]
    del model
    run = {"versions": versions(), "profile": plat.profile.name, "forced": plat.forced, "rows": args.rows,
           "projections_ms": {}, "decode_bs1": {}, "auto": platform.choose_path(plat, "cpu", "auto", "auto").label(plat.profile)}
    for name, (dtype, packing) in projection_options(plat).items():
        run["projections_ms"][name] = {str(r): projections_ms(weights, dtype, packing, r) for r in args.rows}
        print(name, {r: f"{ms:.1f} ms" for r, ms in run["projections_ms"][name].items()}, flush=True)
    for route, (dtype, use_kernel) in DECODE_ROUTES.items():
        tps, compile_s = decode_tokens_per_s(checkpoint, dtype, use_kernel)
        run["decode_bs1"][route] = {"tokens_per_s": tps, "compile_s": compile_s}
        print(f"compiled batch-1 decode, {route}: {tps:.1f} tok/s", flush=True)
    profiles = previous_profiles(RESULTS / "paths.json")
    profiles[plat.profile.name] = {**run, "date": time.strftime("%Y-%m-%d")}
    write_json("paths.json", {"profiles": profiles})
    plot(run, RESULTS / "paths.png")
    write_section("paths", markdown(profiles, " ".join(sys.argv[1:])))


def plot(run: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name, by_rows in run["projections_ms"].items():
        rows = [int(r) for r in by_rows]
        ax.plot(rows, [r / ms * 1e3 for r, ms in zip(rows, by_rows.values())], marker="o", label=name)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("rows per call (batch size in decode, prompt tokens in prefill)")
    ax.set_ylabel("rows/s through all projections (log)")
    ax.set_title(f"SmolLM2-135M projections, CPU profile {run['profile']} ({run['versions']['machine']})", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def markdown(profiles: dict, argv: str) -> str:
    sections = []
    for name, run in sorted(profiles.items()):
        rows = run["rows"]
        table = "\n".join(f"| {opt} | " + " | ".join(f"{ms:.1f}" for ms in by_rows.values()) + " |"
                          for opt, by_rows in run["projections_ms"].items())
        decode = ", ".join(f"{route} {v['tokens_per_s']:.1f} tok/s" for route, v in run["decode_bs1"].items())
        sections.append(f"""{profile_heading(name, run)}

Auto path: `{run['auto']}`. All 211 projections once, ms (lower is better):

| weights, compute | """ + " | ".join(f"{r} row{'s' if r > 1 else ''}" for r in rows) + " |\n|---|" + "---|" * len(rows) + f"""
{table}

Compiled batch-1 decode step (plain weights, one row through each route): {decode}.
""")
    return f"""## Per CPU profile

What each CPU profile runs by default (`dtype: auto`, `packed_weights: auto`) and why. Command:
`.venv/bin/python -m bench.paths {argv}` (add `--cpu-profile NAME` for a lower profile of the same
machine); each profile's latest run is kept in results/paths.json.

""" + "\n".join(sections) + "\n![paths](results/paths.png)\n"


if __name__ == "__main__":
    main()
