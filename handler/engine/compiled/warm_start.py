"""Serve at once, compiled moments later: a verified artifact loads in a background thread.

Loading an AOT artifact costs ~2-3 s of Python (Dynamo and Inductor imports, unpickling graphs,
rebuilding guards) on top of an eager start. On a replacement instance that is capacity idling,
so by default the worker reports ready as soon as the weights are in, serves the model's eager
steps meanwhile, and switches to the compiled steps between two engine steps once they are
loaded. The switch is safe at any step: compiled graphs take the weights and the KV cache from
the live model as inputs, so both kinds of step read and write the same cache.

What loads in the background is a verified artifact: one found at start, or one that
handler.engine.compiled.cold.in_background compiled and installed while eager steps served. A
failed background load is not silent: with on_compile_error=raise every later step raises
CompileError (the worker answers 500 and its logs say why); with on_compile_error=eager it is
logged at ERROR once and counted, as a failed blocking load would be.
"""
from __future__ import annotations

import contextvars
import logging
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from handler.engine.compiled.errors import CompileError, failure_reason

log = logging.getLogger(__name__)

LOADING_SWITCH_INTERVAL = 0.0005  # seconds, while a background load runs
SWITCHED = "serving compiled from this step"  # logged once, at the switch: launchers and benchmarks wait for it
LOADED = "compiled steps are loaded"  # logged by the load: the next step switches (benchmarks drive one at once)


class BackgroundLoad:
    """Runs `load` (returning an object with .prefill and .decode) in a daemon thread; until it
    finishes, step(name) runs the eager step. The callbacks run on the loading thread as the load
    ends (before `done` is set), not at the next step: an idle replica's metrics must not keep
    saying "loading" or "compiling" once the compiled steps are in."""

    def __init__(self, eager: Any, load: Callable[[], Any], allow_eager: bool,
                 on_compiled: Callable[[float], None] | None = None, on_failed: Callable[[str], None] | None = None):
        self._eager, self._load, self._allow_eager = eager, load, allow_eager
        self._on_compiled, self._on_failed = on_compiled, on_failed
        self._loaded: Any = None
        self._error: BaseException | None = None
        self._seconds = 0.0
        self._switched = False
        self.done = threading.Event()
        # The load runs in this thread's context: torch keeps config overrides in context
        # variables, which a new thread would not see. Without them the load ran with Inductor's
        # defaults (-march=native instead of the CPU profile's), so every kernel the artifact
        # carries missed its key and was compiled again at load (minutes for the default model).
        context = contextvars.copy_context()
        self._thread = threading.Thread(target=context.run, args=(self._run,), name="ts-llm-aot-load", daemon=True)

    def start(self) -> BackgroundLoad:
        self._thread.start()
        return self

    def _run(self) -> None:
        start = time.perf_counter()
        # Loading is Python (unpickling, guards) holding the GIL; eager steps need it back
        # between their ops. A shorter switch interval (default 5 ms) keeps them responsive.
        interval = sys.getswitchinterval()
        sys.setswitchinterval(LOADING_SWITCH_INTERVAL)
        try:
            self._loaded = self._load()
        except BaseException as err:  # reported in _report, and raised by steps unless eager is allowed
            self._error = err
        finally:
            sys.setswitchinterval(interval)
        self._seconds = time.perf_counter() - start
        try:  # said and reported before done is set: whoever waits on done finds both
            self._report()
        finally:
            self.done.set()

    def _report(self) -> None:
        if self._error is None:
            log.info("%s; the next step switches to them", LOADED)
            if self._on_compiled is not None:
                self._on_compiled(self._seconds)
        elif self._allow_eager:
            log.error("loading the compiled model in the background FAILED (%s); serving EAGER because "
                      "on_compile_error=eager", failure_reason(self._error), exc_info=self._error)
            if self._on_failed is not None:
                self._on_failed(failure_reason(self._error))

    @property
    def compiled(self) -> bool:
        return self.done.is_set() and self._error is None

    def step(self, name: str) -> Callable:
        def call(*args: Any) -> Any:
            return getattr(self._current(), name)(*args)

        return call

    def _current(self) -> Any:
        if not self.done.is_set():
            return self._eager
        if self._error is None:
            if not self._switched:
                self._switched = True
                log.info("compiled steps loaded in the background in %.1f s; %s", self._seconds, SWITCHED)
            return self._loaded
        return self._eager_after_failure(self._error)

    def _eager_after_failure(self, error: BaseException) -> Any:
        if not self._allow_eager:  # the eager fallback was reported as the load ended
            raise CompileError(f"loading the compiled model in the background failed ({failure_reason(error)}); "
                               "fix it or set on_compile_error: eager") from error
        return self._eager

