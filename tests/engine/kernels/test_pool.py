"""The kernels' own threads (pool.c): a product is the same on any number of threads, in the pool or
in OpenMP's team; a forked child, a second calling thread and loops of different sizes in turn get
their products too."""
from __future__ import annotations

import subprocess
import sys
import threading

import pytest
import torch

from handler.engine.kernels import build
from handler.engine.kernels.matvec import bf16_linear
from handler.engine.quant.ops import quantized_linear
from handler.engine.quant.rtn import quantize_int4, quantize_int8


@pytest.fixture
def kernel_threads():
    """ts_llm_set_threads for one test, then back to "not set" (the pool, with torch's threads)."""
    library = build.load()
    yield library.ts_llm_set_threads
    library.ts_llm_set_threads(-1)


W = torch.randn(200, 96, generator=torch.Generator().manual_seed(1)) * 0.05
INT4, INT8 = quantize_int4(W, 32).pack(), quantize_int8(W).pack()


def products(x: torch.Tensor) -> list[torch.Tensor]:
    return [quantized_linear(x, INT4, None, rounds) for rounds in (1, 2)] + \
           [quantized_linear(x, INT8), bf16_linear(x, W.bfloat16())]


@pytest.mark.parametrize("rows", [1, 5, 16])
def test_a_product_is_the_same_on_any_number_of_threads(kernel_threads, rows):
    # each row group is computed by one thread whoever it is: the bits do not depend on the split
    x = torch.randn(rows, 96)
    kernel_threads(1)
    alone = products(x)
    for n in (2, 3, 7, 0):  # 0: OpenMP's team, as before the pool
        kernel_threads(n)
        assert all(torch.equal(a, b) for a, b in zip(alone, products(x), strict=True)), n


def test_two_calling_threads_both_get_their_products(kernel_threads):
    # one loop at a time in the pool: the caller that finds it busy runs its loop alone
    kernel_threads(2)
    x = torch.randn(4, 96)
    expected = products(x)
    failures: list[int] = []

    def call(i: int) -> None:
        for _ in range(50):
            if not all(torch.equal(a, b) for a, b in zip(expected, products(x), strict=True)):
                failures.append(i)

    callers = [threading.Thread(target=call, args=(i,)) for i in range(3)]
    for t in callers:
        t.start()
    for t in callers:
        t.join(timeout=120)
    assert not failures and not any(t.is_alive() for t in callers)


FORKED = """
import os, torch
from handler.engine.kernels import build
from handler.engine.quant.ops import quantized_linear
from handler.engine.quant.rtn import quantize_int4
build.load().ts_llm_set_threads(2)
w, x = quantize_int4(torch.randn(64, 64), 32).pack(), torch.randn(3, 64)
y = quantized_linear(x, w)  # the parent's workers start
pid = os.fork()
if pid == 0:  # the child has no workers of the parent's: it starts its own
    os._exit(0 if torch.equal(quantized_linear(x, w), y) else 1)
print("child exit", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
"""


def test_a_forked_child_runs_its_products():
    run = subprocess.run([sys.executable, "-c", FORKED], capture_output=True, text=True, timeout=120)
    assert run.stdout.strip() == "child exit 0", run.stdout + run.stderr


def test_the_count_of_times_alone_is_exported_and_never_goes_back(kernel_threads):
    kernel_threads(2)
    before = build.times_alone()
    products(torch.randn(16, 96))
    assert 0 <= before <= build.times_alone()


def test_loops_of_different_sizes_one_after_another_each_finish_whole(kernel_threads):
    # each thread counts the chunks it ran once, at the loop's end, and a loop is closed before the
    # next one is described: every product of a run of loops, small and large in turn, on more
    # threads than cores (workers often late to a loop), is the one a lone thread makes
    small, large = quantize_int4(W[:24], 32).pack(), INT4
    x = torch.randn(1, 96)
    kernel_threads(1)
    expected = [quantized_linear(x, w, None, 2) for w in (small, large)]
    kernel_threads(4)
    wrong = sum(not torch.equal(quantized_linear(x, w, None, 2), want)
                for _ in range(3000) for w, want in zip((small, large), expected, strict=True))
    assert wrong == 0
