"""The cold compile's graphs side by side: prefill's, and decode's general graph, each compiled
in a process of its own while this process compiles decode's batch-1 graph.

A graph compiles in one thread (Dynamo, AOT autograd and Inductor's scheduler are Python, then
g++), so graphs side by side use the cores a compile would leave idle; each is slower sharing
them, but none waits for another (docs/benchmarks.md, "Compile settings"). The children
compile into this compile's Inductor build dir, so the kernels and header they build are packed
with the artifact, and save their graphs, which are loaded here and join this process's graphs
in one artifact. In handler.engine.compiled.cold.in_background they are forked with the model prepared
there; elsewhere (archive.sh --aot, a blocking cold start in a worker) they start afresh:

    python -m handler.engine.compiled.cold.side_by_side --config JSON --step NAME --kinds KIND[,KIND] \
        --threads N --model-cache-dir DIR --kernel-dir DIR --out DIR --parent PID
"""
from __future__ import annotations

import argparse
import contextlib
import json
import logging
import multiprocessing
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from pathlib import Path

import torch

from handler.engine import config, platform
from handler.engine.checkpoint import open_checkpoint
from handler.engine.compiled import aot, cpp_cache, saved_graphs, shapes
from handler.engine.compiled.cold import compile_times
from handler.engine.compiled.cold.child import exit_now, watch_parent
from handler.engine.compiled.compile_progress import CompileProgress, SideBySide
from handler.engine.compiled.prepare import prepare_model
from handler.engine.config import EngineConfig
from handler.engine.model.transformer import Transformer

log = logging.getLogger(__name__)

SHAPES_FILE = "shapes.json"
REPORT_SECONDS = 15.0  # between the progress lines of the graphs compiling side by side


@dataclass(frozen=True)
class Part:
    """Some graphs of one step: what a child process compiles."""
    step: shapes.StepName
    kinds: tuple[aot.GraphKind, ...]

    def __str__(self) -> str:
        return self.step if self.kinds == aot.KINDS else f"{self.step}, {', '.join(self.kinds)}"


IN_CHILDREN = (Part("prefill", aot.KINDS), Part("decode", ("general",)))  # compiled by children
HERE = Part("decode", ("batch 1",))  # compiled in this process meanwhile


def progress(part: Part) -> CompileProgress:
    """Progress lines numbering the graphs of HERE and IN_CHILDREN as one compile: graph 2 of 3 ..."""
    parts = [HERE, *IN_CHILDREN]
    counts = [aot.expected_graphs(p.step, p.kinds) for p in parts]
    i = parts.index(part)
    return CompileProgress(sum(counts), first=1 + sum(counts[:i]), beside=len(parts) - 1)


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def compile_in_parts(model: Transformer, cfg: EngineConfig, model_cache_dir: str, build_dir: Path,
                  fork_threads: int | None = None) -> dict[shapes.StepName, saved_graphs.SavedGraphs]:
    """Every step's graphs (aot.compile_steps), saved under `build_dir` (the private build dir,
    cpp_cache.private_build_dirs, this compile's Inductor cache) and loaded back once, with the
    IN_CHILDREN parts compiled in child processes when there are two cores or more (CPU only: on CUDA
    the graphs' compile is not what bounds a cold start here). Each graph is loaded while the
    graphs still compiling elsewhere run. `model_cache_dir` is the Inductor cache `model` was
    prepared in (its quantized kernels are there: a child need not build them).

    `fork_threads`: this process has run torch on one thread only (handler.engine.compiled.cold.in_background):
    the children are then forked with the model as prepared here instead of started afresh (~6 s
    of CPU each, imports and the model, on the critical path of a cold start), and every process
    runs `fork_threads` threads from then on. A team of OpenMP threads does not survive a fork:
    in a child forked after a parallel op, the next parallel op hangs."""
    graphs_dir = build_dir / "graphs"
    if usable_cores() < 2 or torch.device(cfg.device).type != "cpu":
        _set_threads(fork_threads)
        steps = aot.compile_steps(model, cfg)
        return {name: saved_graphs.save_and_reload(steps.step(name).graphs, steps.examples[name], name, graphs_dir)
                for name in aot.STEPS}
    outs = [graphs_dir / f"child-{i}" for i in range(len(IN_CHILDREN))]
    side_by_side = _side_by_side(Path(model_cache_dir), len(model.layers))
    children: list[Child]
    if fork_threads is None:
        children = [_start(cfg, part, model_cache_dir, build_dir, out) for part, out in zip(IN_CHILDREN, outs, strict=True)]
    else:
        children = [_fork(model, cfg, part, out, fork_threads) for part, out in zip(IN_CHILDREN, outs, strict=True)]
    _set_threads(fork_threads)
    try:
        with _reporting(side_by_side):  # a thread: started after the fork, as a fork copies none
            here, examples = aot.compile_step(model, HERE.step, cfg, progress(HERE), HERE.kinds)
            side_by_side.finished(str(HERE), time.monotonic())
            decode = saved_graphs.save_and_reload(here.graphs, examples, HERE.step, graphs_dir / "here")
            prefill, general = (_collect(part, child, out, side_by_side)
                                for part, child, out in zip(IN_CHILDREN, children, outs, strict=True))
    finally:
        _stop(children)  # this side failed or was interrupted: the children's work is moot
    compile_times.save(Path(model_cache_dir), len(model.layers), side_by_side.done)
    # decode's general graphs after the batch-1 graph: match() takes the first that accepts a call
    return {"prefill": prefill, "decode": decode + general}


def _side_by_side(model_cache_dir: Path, layers: int) -> SideBySide:
    parts = tuple(str(part) for part in (HERE, *IN_CHILDREN))
    expected, basis = compile_times.expected(model_cache_dir, parts, layers, usable_cores())
    return SideBySide(parts, time.monotonic(), expected, basis)


@contextlib.contextmanager
def _reporting(side_by_side: SideBySide) -> Iterator[None]:
    """The parts' progress as one line now and every REPORT_SECONDS until the block ends."""
    stop = threading.Event()

    def report() -> None:
        while True:
            log.info("aot: %s", side_by_side.line(time.monotonic()))
            if stop.wait(REPORT_SECONDS):
                return

    thread = threading.Thread(target=report, name="compile progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def _set_threads(threads: int | None) -> None:
    if threads is not None:
        torch.set_num_threads(threads)


Child = subprocess.Popen | BaseProcess  # started afresh, or forked


def _start(cfg: EngineConfig, part: Part, model_cache_dir: str, build_dir: Path, out: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", __name__, "--config", config.to_json(cfg), "--step", part.step,
           "--kinds", ",".join(part.kinds), "--threads", str(torch.get_num_threads()),
           "--model-cache-dir", model_cache_dir, "--kernel-dir", str(build_dir), "--out", str(out),
           "--parent", str(os.getpid())]
    log.info("aot: compiling %s in a process of its own beside this one", part)
    return subprocess.Popen(cmd)  # its output goes where ours goes (the worker log)


def _fork(model: Transformer, cfg: EngineConfig, part: Part, out: Path, threads: int) -> BaseProcess:
    log.info("aot: compiling %s in a process of its own beside this one (forked)", part)
    child = multiprocessing.get_context("fork").Process(target=_forked, args=(model, cfg, part, out, threads, os.getpid()),
                                                        name=f"compile {part}")
    child.start()  # flushes this process's streams first: the child would write what they hold again
    return child


def _forked(model: Transformer, cfg: EngineConfig, part: Part, out: Path, threads: int, parent: int) -> None:
    """A forked child's work: Inductor's cache and header dir are the parent's build dir already."""
    _as_child(part, parent, threads)
    code = 1
    try:
        _compile_part(model, cfg, part, out)
        code = 0
    except BaseException:
        log.exception("aot: compiling %s failed", part)
    exit_now(code)


def _as_child(part: Part, parent: int, threads: int) -> None:
    logging.basicConfig(level=logging.INFO, format=f"compile process ({part}): %(levelname)s %(name)s: %(message)s",
                        force=True)
    watch_parent(parent)
    torch.set_num_threads(threads)


def _collect(part: Part, child: Child, out: Path, side_by_side: SideBySide) -> saved_graphs.SavedGraphs:
    """A child's graphs once it has exited, loaded (their kernels are in this process's build dir)."""
    code: int | None  # a process's exitcode is None only while it runs
    if isinstance(child, subprocess.Popen):
        code = child.wait()
    else:
        child.join()
        code = child.exitcode
    side_by_side.finished(str(part), time.monotonic())
    if code != 0:
        raise aot.AotError(f"compiling {part} in a process of its own (pid {child.pid}) failed with exit code "
                           f"{code}; its error is in the log above, as 'compile process ({part}):'")
    return saved_graphs.reload(json.loads((out / SHAPES_FILE).read_text()), out)


def _stop(children: list[Child]) -> None:
    for child in children:
        if isinstance(child, subprocess.Popen):
            if child.poll() is None:
                child.kill()
                child.wait()
        elif child.is_alive():
            child.kill()
            child.join()


def compile_part_in_child(cfg: EngineConfig, part: Part, model_cache_dir: Path, kernel_dir: Path, out: Path) -> None:
    """A started child's work: the model as the parent has it (prepared in the parent's Inductor
    cache, where its quantized kernels are built already), then _compile_part with its kernels
    and header built in `kernel_dir` (the parent's build dir)."""
    from torch._inductor.runtime.cache_dir_utils import temporary_cache_dir

    platform.current()  # the profile's -march, as the parent compiles with
    with temporary_cache_dir(str(model_cache_dir)):
        model = prepare_model(open_checkpoint(cfg.checkpoint_dir), cfg)
    with cpp_cache.build_dirs(kernel_dir):
        _compile_part(model, cfg, part, out)


def _compile_part(model: Transformer, cfg: EngineConfig, part: Part, out: Path) -> None:
    """The part's graphs saved in `out` with their example shapes."""
    step, examples = aot.compile_step(model, part.step, cfg, progress(part), part.kinds)
    (out / SHAPES_FILE).write_text(json.dumps(saved_graphs.save_graphs(step.graphs, examples, part.step, out)))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=f"python -m {__name__}", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, help="the resolved EngineConfig, as JSON")
    p.add_argument("--step", required=True, choices=aot.STEPS, help="the step whose graphs to compile")
    p.add_argument("--kinds", required=True, help=f"which of its graphs, comma-separated: {', '.join(aot.KINDS)}")
    p.add_argument("--threads", type=int, required=True, help="the parent's torch threads (the graphs guard on them)")
    p.add_argument("--model-cache-dir", required=True, type=Path, help="the Inductor cache the parent's model was prepared in")
    p.add_argument("--kernel-dir", required=True, type=Path, help="the parent's Inductor build dir (the graphs' kernels)")
    p.add_argument("--out", required=True, type=Path, help="where the graphs and their shapes go")
    p.add_argument("--parent", type=int, required=True, help="stop when this process is gone")
    args = p.parse_args(argv)
    kinds = tuple(args.kinds.split(","))
    if not kinds or any(k not in aot.KINDS for k in kinds):
        p.error(f"--kinds: {args.kinds!r}; each must be one of {', '.join(aot.KINDS)}")
    part = Part(args.step, kinds)
    _as_child(part, args.parent, args.threads)
    compile_part_in_child(config.from_json(args.config), part, args.model_cache_dir, args.kernel_dir, args.out)
    return 0


if __name__ == "__main__":
    exit_now(main())
