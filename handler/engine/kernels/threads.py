"""The engine's CPU threads: how many, and how they wait for each other.

A decode step runs a parallel loop per projection (the default model: over a hundred) and a few
of Inductor's kernels. In an OpenMP team every loop ends at a barrier all threads must reach, so
when another process shares the cores (a node agent, the sidecar, a neighbour's pod) and takes one
thread off its core, every loop of the step waits for it: with libgomp's long spin tokens came
seconds apart, with a short one at half speed, and the short spin cost speed on a quiet machine
too (docs/benchmarks.md, "On a shared CPU").

`threading: pool` (the default) runs the products and attention in the kernels' own pool (pool.c):
threads claim chunks of a loop, the caller too, so a thread that has not come takes no share and
nobody waits for it; a worker spins 300 us between loops, then sleeps. Torch's own ops (Inductor's
kernels between them, sampling) then run on one thread: two teams of threads, each spinning for the same cores,
were measured far slower. `threading: openmp` is the code before issue 58: everything in
torch's libgomp team (docs/benchmarks.md, "On a shared CPU").

libgomp reads GOMP_SPINCOUNT once, when torch loads it, so it belongs in the environment that starts
the worker: platform.child_environment adds `environment()` (the launcher, the sidecar's entrypoint),
and the manifests set it. An operator's own GOMP_SPINCOUNT or OMP_WAIT_POLICY is kept. `take()`
applies an engine's choice; `in_force()` is what the worker runs with, for its log and the
ts_llm_engine_threads metric."""
from __future__ import annotations

import ctypes
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from handler.engine.config import EngineConfig

SPIN_COUNT = 3000  # spins before a waiting thread sleeps: microseconds (libgomp's default: 300,000)
LIBGOMP_DEFAULT = 300_000
WAIT_VARIABLES = ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")
POOL_WAIT = "pool: spin 300 us, then sleep"  # pool.c's SPIN_NS
CORES = torch.get_num_threads()  # torch's default (the cores, or OMP_NUM_THREADS), before take() changes it


def environment(environ: Mapping[str, str]) -> dict[str, str]:
    """What a worker's environment needs beyond `environ`: the bounded spin, unless the operator
    chose how threads wait (GOMP_SPINCOUNT or OMP_WAIT_POLICY set)."""
    if any(environ.get(name, "").strip() for name in WAIT_VARIABLES):
        return {}
    return {"GOMP_SPINCOUNT": str(SPIN_COUNT)}


@dataclass(frozen=True)
class ThreadSettings:
    threads: int  # the threads of the quantized products: the pool's, or torch's OpenMP team
    # how a waiting thread waits: POOL_WAIT, or libgomp's "spin N" (then sleep), "passive", "active",
    # "libgomp default (spin N)"
    wait: str
    graph_threads: int  # torch's intra-op threads: Inductor's kernels and torch's ops

    @property
    def bounded(self) -> bool:
        """Whether a waiting thread gives its core up (what a shared CPU needs): the pool does; in an
        OpenMP team only a short spin (30,000 was measured to stall nearly as the default does)."""
        spins = self.wait.removeprefix("spin ")
        return self.wait in (POOL_WAIT, "passive") or (spins.isdigit() and int(spins) <= SPIN_COUNT)

    def describe(self) -> str:
        if self.wait == POOL_WAIT:
            return f"products and attention on {self.threads} threads ({self.wait}), torch's other ops on {self.graph_threads}"
        return f"{self.threads} threads, OpenMP wait: {self.wait}"


def graph_threads(cfg: EngineConfig) -> int:
    """The intra-op threads torch runs an engine's graphs with (what compiled graphs are built for)."""
    return 1 if cfg.threading == "pool" else cfg.threads or CORES


def take(cfg: EngineConfig, kernels: ctypes.CDLL) -> ThreadSettings:
    """Give this process the threads `cfg` asks for (CPU engines): torch's intra-op threads, and the
    quantized products' pool or OpenMP team, told to `kernels` (build.load()'s library)."""
    settings = in_force(cfg)
    torch.set_num_threads(settings.graph_threads)
    kernels.ts_llm_set_threads(settings.threads if cfg.threading == "pool" else 0)  # 0: torch's OpenMP team
    return settings


def in_force(cfg: EngineConfig, started_with: Mapping[str, str] | None = None) -> ThreadSettings:
    """The settings of a process that took `cfg`'s threads: the products' threads and how they wait
    (for an OpenMP team, what libgomp read from the environment the process started with:
    `started_with`, default /proc/self/environ)."""
    if cfg.threading == "pool":
        return ThreadSettings(cfg.threads or CORES, POOL_WAIT, graph_threads(cfg))
    env = started_environment() if started_with is None else started_with
    return ThreadSettings(cfg.threads or CORES, wait_of(env), graph_threads(cfg))


def wait_of(env: Mapping[str, str]) -> str:
    """libgomp's wait from its variables: GOMP_SPINCOUNT wins over OMP_WAIT_POLICY's spin count."""
    spin = env.get("GOMP_SPINCOUNT", "").strip()
    if spin:
        return f"spin {spin}"
    policy = env.get("OMP_WAIT_POLICY", "").strip().lower()
    if policy in ("passive", "active"):
        return policy
    return f"libgomp default (spin {LIBGOMP_DEFAULT})"


def started_environment() -> dict[str, str]:
    """The environment this process started with (what libgomp read when torch loaded it; a later
    os.environ change reaches neither); {} where /proc is not there."""
    path = Path("/proc/self/environ")
    if not path.exists():
        return {}
    pairs = (item.partition(b"=") for item in path.read_bytes().split(b"\0") if item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, _, v in pairs}
