"""The prefill graphs compiled in a process of their own while this process compiles decode's.

A graph compiles in one thread: Dynamo, AOT autograd and Inductor's scheduler are Python, then
one g++ call. Measured on the default model (2 cores, Zen 4): prefill 44 s, decode's batch-1
and general graphs 37 + 48 s, one after the other 129 s. With two or more cores the steps
compile side by side: a child process (this module's main) builds the same model, compiles
prefill into this compile's Inductor cache dir, so the kernels it builds are packed with the
artifact, and saves its graphs; they are loaded here and join decode's in one artifact.

    python -m handler.engine.parallel_compile --config JSON --threads N --model-cache-dir DIR --kernel-dir DIR --out DIR --parent PID
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from handler.engine import aot, config, cpp_cache, platform, shapes
from handler.engine.checkpoint import open_checkpoint
from handler.engine.compile_progress import CompileProgress
from handler.engine.config import EngineConfig
from handler.engine.model import Transformer
from handler.engine.parent_watch import watch_parent
from handler.engine.prepare import prepare_model

log = logging.getLogger(__name__)

ASIDE: shapes.StepName = "prefill"  # the step the child compiles (the shorter one; decode has two graphs)
SHAPES_FILE = "shapes.json"


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def compile_steps(model: Transformer, cfg: EngineConfig, model_cache_dir: str) -> aot.AotSteps:
    """aot.compile_steps, with prefill compiled in a child process when there is a core for it
    (CPU only: on CUDA the graphs' compile is not what bounds a cold start here). Call it in a
    private build dir (cpp_cache.private_build_dirs); `model_cache_dir` is the Inductor cache
    `model` was prepared in (its quantized kernels are there: the child need not build them)."""
    if usable_cores() < 2 or torch.device(cfg.device).type != "cpu":
        return aot.compile_steps(model, cfg)
    with tempfile.TemporaryDirectory(prefix="ts-llm-prefill-") as out:
        child = _start(cfg, model_cache_dir, Path(out))
        try:
            progress = CompileProgress(aot.EXPECTED_GRAPHS["decode"])
            decode, decode_shapes = aot.compile_step(model, "decode", cfg, progress)
            code = child.wait()
        finally:
            if child.poll() is None:  # this side failed or was interrupted: the child's work is moot
                child.kill()
                child.wait()
        if code != 0:
            raise aot.AotError(f"compiling {ASIDE} in a process of its own (pid {child.pid}) failed with exit code "
                               f"{code}; its error is in the log above, as 'compile process ({ASIDE}):'")
        prefill, prefill_shapes = _collect(model, Path(out))
    return aot.AotSteps(prefill, decode, {ASIDE: prefill_shapes, "decode": decode_shapes})


def _start(cfg: EngineConfig, model_cache_dir: str, out: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", __name__, "--config", config.to_json(cfg), "--threads", str(torch.get_num_threads()),
           "--model-cache-dir", model_cache_dir, "--kernel-dir", cpp_cache.inductor_cache_dir(), "--out", str(out),
           "--parent", str(os.getpid())]
    log.info("aot: compiling %s in a process of its own beside this one", ASIDE)
    return subprocess.Popen(cmd)  # its output goes where ours goes (the worker log)


def _collect(model: Transformer, out: Path) -> tuple[aot.CompiledStep, list[shapes.Shape]]:
    """The child's graphs, loaded onto `model` (their kernels are in this process's build dir)."""
    entries = json.loads((out / SHAPES_FILE).read_text())
    graphs = [aot.load_graph(out / e["file"]) for e in entries]
    return aot.CompiledStep(model, ASIDE, graphs), [shapes.Shape.of_entry(e) for e in entries]


def compile_into(cfg: EngineConfig, model_cache_dir: Path, kernel_dir: Path, out: Path) -> None:
    """The child's work: the model as the parent has it (prepared in the parent's Inductor
    cache, where its quantized kernels are built already), the ASIDE step's graphs saved in
    `out` with their example shapes, their kernels built in `kernel_dir` (the parent's build dir)."""
    from torch._inductor.runtime.cache_dir_utils import temporary_cache_dir

    platform.current()  # the profile's -march, as the parent compiles with
    with temporary_cache_dir(str(model_cache_dir)):
        model = prepare_model(open_checkpoint(cfg.checkpoint_dir), cfg)
    with temporary_cache_dir(str(kernel_dir)):
        step, examples = aot.compile_step(model, ASIDE, cfg, CompileProgress(aot.EXPECTED_GRAPHS[ASIDE]))
    entries = []
    for i, (graph, shape) in enumerate(zip(step.graphs, examples, strict=True)):
        name = f"{ASIDE}-{i}.bin"
        graph.save_compiled_function(str(out / name))
        entries.append(shape.entry(name))
    (out / SHAPES_FILE).write_text(json.dumps(entries))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=f"python -m {__name__}", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, help="the resolved EngineConfig, as JSON")
    p.add_argument("--threads", type=int, required=True, help="the parent's torch threads (the graphs guard on them)")
    p.add_argument("--model-cache-dir", required=True, type=Path, help="the Inductor cache the parent's model was prepared in")
    p.add_argument("--kernel-dir", required=True, type=Path, help="the parent's Inductor build dir (the graphs' kernels)")
    p.add_argument("--out", required=True, type=Path, help="where the graphs and their shapes go")
    p.add_argument("--parent", type=int, required=True, help="stop when this process is gone")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format=f"compile process ({ASIDE}): %(levelname)s %(name)s: %(message)s")
    watch_parent(args.parent)
    torch.set_num_threads(args.threads)
    compile_into(config.from_json(args.config), args.model_cache_dir, args.kernel_dir, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
