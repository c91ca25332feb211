"""The quantized kernels' instruction paths side by side on this CPU: plain vectors, VNNI dot
products and AMX-INT8 tiles, whichever this CPU's profile builds, on the same weights and x rows.

    .venv/bin/python -m bench.kernels                      # this CPU's own profile
    .venv/bin/python -m bench.kernels --cpu-profile avx2   # a lower profile of the same machine
    .venv/bin/python -m bench.kernels --cpu-profile avx2_vnni  # AVX2 with AVX-VNNI (Alder Lake, Sierra Forest)

Each path is kernels/build.py's quantized translation unit for one subset of the platform's targets
(without the ops' registration), built by Inductor's compiler with the profile's flags and called
through ctypes, so every path runs in one process, taking turns; every time is the best of 5.
Measured: one decoder layer's projections (q, k, v, o, gate, up, down) of the default model
(SmolLM2-135M) and of the Llama-3.2-1B body, in Q4_0, Q4_1 and Q8_0, random weights (speed does not
depend on the values), 1 to 128 rows (decode batches, prefill chunks), 2 threads. Every path must
give the bit-identical output, or the run fails. Writes docs/results/kernels.json
(`profiles.<name>`: the latest run of each profile), docs/results/kernels.png and the "Quantized
kernels by instruction path" section of docs/benchmarks.md.
"""
from __future__ import annotations

import argparse
import ctypes
import functools
import sys
import time

import torch

from bench.common import RESULTS, best_seconds, previous_profiles, profile_heading, versions, write_json, write_section
from handler.engine import platform
from handler.engine.kernels import build
from handler.engine.quant.layout import QuantizedWeight
from handler.engine.quant.rtn import quantize_int4

ROWS = (1, 2, 4, 8, 16, 32, 64, 128)
REPEATS = 5
# one decoder layer's projections [N, K]: q, k, v, o, gate, up, down
LAYERS = {
    "SmolLM2-135M": [(576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536)],
    "Llama-3.2-1B body": [(2048, 2048), (512, 2048), (512, 2048), (2048, 2048), (8192, 2048), (8192, 2048),
                          (2048, 8192)],
}
FORMATS = ("Q4_0", "Q4_1", "Q8_0")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cpu-profile", metavar="NAME", help="run under this CPU profile (python -m handler.engine.platform)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rows", type=int, nargs="+", default=list(ROWS))
    return p.parse_args()


def path_builds(plat: platform.Platform) -> dict[str, ctypes.CDLL]:
    """name -> the kernels built with that path's targets and every earlier path's, for each path
    this platform's build has (the last one is what the engine runs)."""
    from torch._inductor.codecache import CppCodeCache

    targets: tuple[str, ...] = ()
    builds = {"plain": CppCodeCache.load(build.quantized_source(()), needs_vec_isa=True)}
    for name, names in build.PATH_TARGETS.items():
        if adds := tuple(t for t in plat.kernel_targets if t in names):
            targets += adds
            builds[name] = CppCodeCache.load(build.quantized_source(targets), needs_vec_isa=True)
    return builds


def weight(fmt: str, n: int, k: int) -> QuantizedWeight:
    w = torch.randn(n, k) * 0.05
    if fmt == "Q8_0":  # int8 with a scale per block of 32, as GGUF's Q8_0
        d = w.view(n, k // 32, 32).abs().amax(-1) / 127
        q = torch.round(w.view(n, k // 32, 32) / d[..., None]).clamp(-127, 127).to(torch.int8).view(n, k)
        return QuantizedWeight(q, d.half()).pack()
    int4 = quantize_int4(w, 32)
    return (int4 if fmt == "Q4_1" else QuantizedWeight(int4.q, int4.d)).pack()


def call(library: ctypes.CDLL, x: torch.Tensor, w: QuantizedWeight, y: torch.Tensor, threads: int, rounds: int = 1) -> None:
    n, k = w.shape
    ptr = ctypes.c_void_p
    library.ts_llm_quantized_linear(
        ctypes.c_int(w.bits), ptr(x.data_ptr()), ptr(w.q.data_ptr()), ptr(w.d.data_ptr()),
        ptr(0 if w.m is None else w.m.data_ptr()), ptr(y.data_ptr()), ctypes.c_int64(x.shape[0]), ctypes.c_int64(n),
        ctypes.c_int64(k), ctypes.c_int64(w.group_size), ctypes.c_int(rounds), ctypes.c_int(threads))


def layer_ms(builds: dict[str, ctypes.CDLL], weights: list[QuantizedWeight], rows: int, threads: int) -> dict[str, float]:
    """ms for one pass through the layer's projections on each path (taking turns), after checking
    that every path gives the same bits."""
    xs = [torch.randn(rows, w.shape[1]) for w in weights]
    outs = {name: [torch.empty(rows, w.shape[0]) for w in weights] for name in builds}
    for name, library in builds.items():
        for x, w, y in zip(xs, weights, outs[name]):
            call(library, x, w, y, threads)
    for name, ys in outs.items():
        if not all(torch.equal(a, b) for a, b in zip(ys, outs["plain"])):
            raise SystemExit(f"the {name} path's output differs from the plain path's at {rows} rows")
    def one_pass(library: ctypes.CDLL, ys: list[torch.Tensor]) -> None:
        for x, w, y in zip(xs, weights, ys):
            call(library, x, w, y, threads)

    best = {name: float("inf") for name in builds}
    for _ in range(REPEATS):  # turns: a slow spell of the host falls on every path
        for name, library in builds.items():
            best[name] = min(best[name], best_seconds(functools.partial(one_pass, library, outs[name]), "cpu", 1) * 1e3)
    return best


def main() -> None:
    args = parse_args()
    platform.reexec_under(args.cpu_profile)
    plat = platform.current()  # before building: the profile's -march, and Linux's tile grant
    torch.manual_seed(0)
    builds = path_builds(plat)
    run = {"versions": versions(), "profile": plat.profile.name, "forced": plat.forced, "paths": list(builds),
           "engine_path": list(builds)[-1], "rows": args.rows, "threads": args.threads, "layer_ms": {}}
    for model, shapes in LAYERS.items():
        for fmt in FORMATS:
            weights = [weight(fmt, n, k) for n, k in shapes]
            by_rows = {str(r): layer_ms(builds, weights, r, args.threads) for r in args.rows}
            run["layer_ms"][f"{model} {fmt}"] = by_rows
            print(model, fmt, {r: {p: round(ms, 2) for p, ms in v.items()} for r, v in by_rows.items()}, flush=True)
    profiles = previous_profiles(RESULTS / "kernels.json")
    profiles[plat.profile.name] = {**run, "date": time.strftime("%Y-%m-%d")}
    write_json("kernels.json", {"profiles": profiles})
    plot(run, RESULTS / "kernels.png")
    write_section("kernels", markdown(profiles, " ".join(sys.argv[1:])))


def plot(run: dict, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(LAYERS), figsize=(11, 4.5), sharey=True)
    for ax, model in zip(axes, LAYERS):
        for key, by_rows in run["layer_ms"].items():
            if not key.startswith(model):
                continue
            rows = [int(r) for r in by_rows]
            for path_name in run["paths"][1:]:
                ax.plot(rows, [v["plain"] / v[path_name] for v in by_rows.values()], marker="o",
                        label=f"{key[len(model) + 1:]}, {path_name}")
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("rows per call (decode batch, prefill chunk)")
        ax.set_title(f"{model}, one layer", fontsize=9)
        ax.legend(fontsize=7)
    axes[0].set_ylabel("speed-up over the plain vector path")
    fig.suptitle(f"Quantized kernels by path, CPU profile {run['profile']} ({run['versions']['machine']})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def markdown(profiles: dict, argv: str) -> str:
    sections = []
    for name, run in sorted(profiles.items()):
        rows = run["rows"]
        header = "| layer, format, path | " + " | ".join(str(r) for r in rows) + " |\n|---|" + "---|" * len(rows)
        lines = [f"| {key}, {path_name}{' (engine)' if path_name == run['engine_path'] else ''} | "
                 + " | ".join(f"{by_rows[str(r)][path_name]:.2f}" for r in rows) + " |"
                 for key, by_rows in run["layer_ms"].items() for path_name in run["paths"]]
        sections.append(f"{profile_heading(name, run)}\n\n"
                        f"One decoder layer's projections, ms a pass (lower is better), by rows per call; "
                        f"{run['threads']} threads; every path gave the same bits.\n\n{header}\n" + "\n".join(lines) + "\n")
    return f"""## Quantized kernels by instruction path

The int4 / int8 products (kernels/quantized.c, amx.c) on each path this CPU's profile builds:
plain vectors (AVX2 or AVX-512 without VNNI), VNNI dot products (AVX-512 VNNI, or AVX-VNNI on the
avx2_vnni profile), AMX-INT8 tiles (from 8 rows; fewer take VNNI).
Command: `{" ".join([".venv/bin/python -m bench.kernels", argv]).strip()}`; each profile's latest
run is kept in results/kernels.json.

""" + "\n".join(sections) + "\n![kernels](results/kernels.png)\n"


if __name__ == "__main__":
    main()
