"""The cold compile in a process of its own, so the worker serves eagerly meanwhile.

A worker that finds no usable artifact starts this process (start_compile_process, from
handler.engine.compiled.artifact_lookup) and serves the model's eager steps; this process builds
the same model, AOT-compiles every serving shape (two of the three graphs in processes forked
beside it when there are two cores or more: handler.engine.compiled.cold.side_by_side) and
installs a verified artifact in the cache dir exactly as `archive.sh --aot` does; the worker
waits for it (wait_for_compile), then loads it in the background and switches between two steps
(handler.engine.compiled.warm_start).
A process, not a thread: compiling is minutes of Python holding its own GIL, and the worker's
steps and TorchServe heartbeats must not wait on it. It runs at a lower priority so that the
serving worker keeps the CPU it needs, with the worker's torch thread count (the compiled
graphs guard on it). It stops when the worker does (`--parent`): a compile nobody waits for any
more would hold a core and the cache lock for minutes after `./serve.sh --stop`.

    python -m handler.engine.compiled.cold.in_background --config '<EngineConfig JSON>' --key DIGEST --dest DIR [--parent PID]
"""
from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
from pathlib import Path

import torch

from handler.cache.check import Verdict
from handler.cache.key import CacheKey
from handler.engine import config
from handler.engine.checkpoint import open_checkpoint
from handler.engine.compiled import artifacts
from handler.engine.compiled.artifacts import ArtifactPlaces
from handler.engine.compiled.cold.child import exit_now, watch_parent
from handler.engine.compiled.cold.compile_all import compile_and_install
from handler.engine.compiled.errors import CompileError
from handler.engine.compiled.prepare import prepare_model
from handler.engine.config import EngineConfig

log = logging.getLogger("handler.engine.compiled.cold.in_background")

NICENESS = 10  # below the serving worker: its steps win the CPU when both want it


def start_compile_process(cfg: EngineConfig, key: CacheKey, dest: Path) -> subprocess.Popen:
    """The compile process for `cfg` (this module's main), started; its output goes where this
    process's goes (TorchServe's worker log)."""
    # The same torch thread count as this worker: the graphs guard on it. The CPU the worker
    # needs is kept by the process's lower priority (each compile process runs one thread of
    # Python and g++; handler.engine.compiled.cold.side_by_side adds a second beside it on two cores).
    cmd = [sys.executable, "-m", __name__, "--config", config.to_json(cfg), "--key", key.digest(),
           "--dest", str(dest), "--threads", str(torch.get_num_threads()), "--parent", str(os.getpid())]
    return subprocess.Popen(cmd)


def wait_for_compile(process: subprocess.Popen) -> None:
    """Until the compile process exits; a CompileError unless it succeeded."""
    code = process.wait()
    if code != 0:
        raise CompileError(f"the compile process (pid {process.pid}) exited with code {code}; its error is in "
                           "the worker log above, as 'compile process:'")


def compile_artifact(cfg: EngineConfig, digest: str, dest: Path, fork_threads: int | None = None) -> str:
    """Compile and install the artifact for `cfg` in dest unless a verified one is there; says
    what it did. The key is computed here as the worker computes it and must be the one asked.
    `fork_threads`: this process has run torch on one thread so far (see main)."""
    ckpt = open_checkpoint(cfg.checkpoint_dir)
    key = artifacts.artifact_key(cfg, artifacts.weights_digest(ckpt), fork_threads)
    if key.digest() != digest:
        raise ValueError(f"this process computes cache key {key.digest()}, the worker asked for {digest}")
    with artifacts.holding(ArtifactPlaces(dest)):
        if artifacts.check_dir(dest, key).verdict == Verdict.VERIFIED:
            return f"artifact {digest} already installed in {dest} (another worker compiled it)"
        compile_and_install(prepare_model(ckpt, cfg), cfg, key, dest, fork_threads)
    return f"artifact {digest} installed in {dest}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m handler.engine.compiled.cold.in_background", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, help="the worker's resolved EngineConfig, as JSON")
    p.add_argument("--key", required=True, help="the cache key digest the worker looks for")
    p.add_argument("--dest", required=True, type=Path, help="the compile cache dir to install into")
    p.add_argument("--threads", type=int, required=True, help="the worker's torch threads (the graphs guard on them)")
    p.add_argument("--parent", type=int, help="stop when this process (the worker) is gone")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="compile process: %(levelname)s %(name)s: %(message)s")
    if args.parent is not None:
        watch_parent(args.parent)
    os.nice(NICENESS)
    # One thread until the processes compiling beside this one are forked, with the model as
    # prepared here (handler.engine.compiled.cold.side_by_side); then the worker's count.
    torch.set_num_threads(1)
    log.info(compile_artifact(config.from_json(args.config), args.key, args.dest, fork_threads=args.threads))
    return 0


if __name__ == "__main__":
    exit_now(main())
