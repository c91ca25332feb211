"""The engine thread's OpenMP: the thread that loaded the model releases its worker threads."""
from __future__ import annotations

import os
import time

import pytest
import torch

from handler.serving import openmp

needs_libgomp = pytest.mark.skipif(openmp._loaded_libgomp() is None, reason="torch's OpenMP is not libgomp here")


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


@needs_libgomp
def test_releasing_ends_this_threads_openmp_workers():
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        torch.ones(1 << 22).sum()  # a parallel region: this thread's pool has a worker now
        before = _threads()
        assert openmp.release_this_threads_pool()
        deadline = time.monotonic() + 5
        while _threads() >= before and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _threads() < before
        assert torch.ones(1 << 22).sum().item() == 1 << 22  # and the next region starts a pool again
    finally:
        torch.set_num_threads(threads)


def test_without_libgomp_nothing_is_released_and_the_log_says_so(monkeypatch, caplog):
    monkeypatch.setattr(openmp, "_loaded_libgomp", lambda: None)
    with caplog.at_level("INFO", logger=openmp.__name__):
        assert openmp.release_this_threads_pool() is False
    assert "not libgomp" in caplog.text
