"""How the engine's threads wait: the bounded spin a worker starts with, an operator's own choice
kept, and what the worker reports (handler/engine/kernels/threads.py)."""
from __future__ import annotations

import os
import subprocess
import sys

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


def test_only_a_short_spin_or_passive_counts_as_bounded():
    assert threads.in_force(2, {"GOMP_SPINCOUNT": "3000"}).bounded
    assert threads.in_force(2, {"OMP_WAIT_POLICY": "passive"}).bounded
    assert not threads.in_force(2, {}).bounded
    assert not threads.in_force(2, {"GOMP_SPINCOUNT": "infinite"}).bounded
    assert threads.in_force(2, {}).describe() == "2 threads, OpenMP wait: libgomp default (spin 300000)"


def test_the_wait_in_force_is_the_one_the_process_started_with():
    # libgomp read the environment when the process started; a later os.environ change reaches nothing
    code = ("import os; from handler.engine.kernels import threads; os.environ['GOMP_SPINCOUNT'] = '9'; "
            "print(threads.in_force(1).wait)")
    env = {**os.environ, "GOMP_SPINCOUNT": "3000"}
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, check=True)
    assert run.stdout.strip() == "spin 3000"
