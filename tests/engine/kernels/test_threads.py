"""How the engine's threads wait: the pool or OpenMP's team, the bounded spin a worker starts with,
an operator's own choice kept, and what the worker reports (handler/engine/kernels/threads.py)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from handler.engine.config import EngineConfig
from handler.engine.kernels import threads


def test_a_worker_gets_the_bounded_spin():
    assert threads.environment({"HOME": "/h"}) == {"GOMP_SPINCOUNT": str(threads.SPIN_COUNT)}


def test_an_operators_own_wait_is_kept():
    assert threads.environment({"GOMP_SPINCOUNT": "100000"}) == {}
    assert threads.environment({"OMP_WAIT_POLICY": "ACTIVE"}) == {}


def test_the_wait_is_read_as_libgomp_reads_it():
    assert threads.wait_of({}) == "libgomp default (spin 300000)"
    assert threads.wait_of({"OMP_WAIT_POLICY": "PASSIVE"}) == "passive"
    assert threads.wait_of({"OMP_WAIT_POLICY": "active", "GOMP_SPINCOUNT": "3000"}) == "spin 3000"


def openmp(threads: int = 2) -> EngineConfig:
    return EngineConfig(Path("ckpt"), threading="openmp", threads=threads)


def test_only_the_pool_a_short_spin_or_passive_counts_as_bounded():
    assert threads.in_force(EngineConfig(Path("ckpt"))).bounded
    assert threads.in_force(openmp(), {"GOMP_SPINCOUNT": "3000"}).bounded
    assert threads.in_force(openmp(), {"OMP_WAIT_POLICY": "passive"}).bounded
    assert not threads.in_force(openmp(), {}).bounded
    assert not threads.in_force(openmp(), {"GOMP_SPINCOUNT": "infinite"}).bounded
    assert threads.in_force(openmp(), {}).describe() == "2 threads, OpenMP wait: libgomp default (spin 300000)"


def test_the_pool_leaves_torch_one_thread_and_the_products_the_rest():
    settings = threads.in_force(EngineConfig(Path("ckpt"), threads=3))
    assert (settings.threads, settings.graph_threads) == (3, 1)
    assert settings.describe() == f"products and attention on 3 threads ({threads.POOL_WAIT}), torch's other ops on 1"


def test_graphs_are_compiled_for_the_threads_torch_gets():
    assert threads.graph_threads(EngineConfig(Path("ckpt"), threads=4)) == 1
    assert threads.graph_threads(openmp(4)) == 4


TAKE = """
import torch
from pathlib import Path
from handler.engine.config import EngineConfig
from handler.engine.kernels import build, threads
for threading in ("pool", "openmp"):
    settings = threads.take(EngineConfig(Path("ckpt"), threading=threading, threads=2), build.load())
    print(threading, torch.get_num_threads(), settings.threads)
"""


def test_take_gives_torch_and_the_products_their_threads():
    run = subprocess.run([sys.executable, "-c", TAKE], capture_output=True, text=True, timeout=300, check=True)
    assert run.stdout.split("\n")[:2] == ["pool 1 2", "openmp 2 2"]


def test_the_wait_in_force_is_the_one_the_process_started_with():
    # libgomp read the environment when the process started; a later os.environ change reaches nothing
    code = ("import os; from pathlib import Path; from handler.engine.config import EngineConfig; "
            "from handler.engine.kernels import threads; os.environ['GOMP_SPINCOUNT'] = '9'; "
            "print(threads.in_force(EngineConfig(Path('ckpt'), threading='openmp')).wait)")
    env = {**os.environ, "GOMP_SPINCOUNT": "3000"}
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, check=True)
    assert run.stdout.strip() == "spin 3000"
