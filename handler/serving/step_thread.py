"""One thread of its own for the engine's steps, so that a step can run while the worker waits for
TorchServe's frontend: continuous batching answers a call, then steps ahead until the next call
comes (ContinuousService's `step_ahead`). Every step runs on this thread, waited for or not, so the
engine's OpenMP parallel regions always start from the same pool of workers
(handler.serving.openmp)."""
from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from time import sleep
from typing import TypeVar

from handler.serving import openmp

T = TypeVar("T")


class StepThread:
    def __init__(self) -> None:
        """From the thread that built the engine: its OpenMP workers are released first
        (handler.serving.openmp), or this thread's regions would run throttled."""
        openmp.release_this_threads_pool()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine-step")
        self._ahead: Future | None = None

    def run(self, step: Callable[[], T]) -> T:
        """`step` on the thread, waited for (after any step started ahead)."""
        return self._pool.submit(step).result()

    def start(self, step: Callable[[], T], delay: float = 0.0) -> None:
        """`step` on the thread, `delay` seconds from now, not waited for: wait() takes its result."""
        assert self._ahead is None, "a step is already running ahead"
        self._ahead = self._pool.submit(_after, delay, step)

    def wait(self) -> T | None:
        """The result of the step started ahead (its exception raised here), None if none was."""
        ahead, self._ahead = self._ahead, None
        return None if ahead is None else ahead.result()


def _after(delay: float, step: Callable[[], T]) -> T:
    if delay > 0:
        sleep(delay)
    return step()
