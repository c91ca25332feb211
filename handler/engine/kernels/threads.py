"""The engine's CPU threads: how many, and how they wait for each other.

A decode step runs ~125 parallel regions (the default model: 121 quantized products and a few Inductor
kernels), each on every thread. libgomp (torch's OpenMP on Linux) makes a thread that waits for the
others, at a region's end or for the next region, spin up to GOMP_SPINCOUNT times before it sleeps:
300,000 by default, about a millisecond. On an idle machine every thread is running and no wait lasts
long. When another process shares the cores (a node agent, the sidecar, a neighbour's pod; nice does
not help across sessions or cgroups), one thread is descheduled and its partner spins away the core
it needs, so every region costs a scheduler time slice: tokens seconds apart. A bounded spin
(SPIN_COUNT) sleeps after a few microseconds and hands the core over; the gaps between regions on an
idle machine are shorter, so quiet speed holds (docs/benchmarks.md, "On a shared CPU").

libgomp reads the variable once, when torch loads it, so it belongs in the environment that starts
the worker: platform.child_environment adds `environment()` (the launcher, the sidecar's entrypoint),
and the manifests set it. An operator's own GOMP_SPINCOUNT or OMP_WAIT_POLICY is kept. `in_force()`
is what the worker started with, for its log and the ts_llm_engine_threads metric."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

SPIN_COUNT = 3000  # spins before a waiting thread sleeps: microseconds (libgomp's default: 300,000)
LIBGOMP_DEFAULT = 300_000
WAIT_VARIABLES = ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")


def environment(environ: Mapping[str, str]) -> dict[str, str]:
    """What a worker's environment needs beyond `environ`: the bounded spin, unless the operator
    chose how threads wait (GOMP_SPINCOUNT or OMP_WAIT_POLICY set)."""
    if any(environ.get(name, "").strip() for name in WAIT_VARIABLES):
        return {}
    return {"GOMP_SPINCOUNT": str(SPIN_COUNT)}


@dataclass(frozen=True)
class ThreadSettings:
    threads: int  # torch's intra-op threads: every parallel region of a step
    wait: str  # how a waiting thread waits: "spin N" (then sleep), "passive", "active", "libgomp default (spin N)"

    @property
    def bounded(self) -> bool:
        """Whether a waiting thread gives its core up within microseconds (what a shared CPU needs)."""
        spins = self.wait.removeprefix("spin ")  # 30,000 was measured to stall nearly as the default does
        return self.wait == "passive" or (spins.isdigit() and int(spins) <= SPIN_COUNT)

    def describe(self) -> str:
        return f"{self.threads} threads, OpenMP wait: {self.wait}"


def in_force(threads: int, started_with: Mapping[str, str] | None = None) -> ThreadSettings:
    """The settings of this process: `threads` (torch.get_num_threads()) and the wait libgomp read
    from the environment the process started with (`started_with`, default /proc/self/environ)."""
    env = started_environment() if started_with is None else started_with
    return ThreadSettings(threads, wait_of(env))


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
