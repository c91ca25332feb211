"""One call run in the background, in a daemon thread of its own, and waited for with a bound: a slow store
must delay neither the drain's stop step (drain/publish.py) nor a replica's start or exit
(app/fleet_stop.py). An abandoned call dies with the process."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class BackgroundCall(Generic[T]):
    """call() started now; its result or error once it ended (times on `clock`)."""

    def __init__(self, call: Callable[[], T], name: str, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self.started = clock()
        self.ended: float | None = None
        self.result: T | None = None
        self.error: Exception | None = None
        self._thread = threading.Thread(target=self._run, args=(call,), name=name, daemon=True)
        self._thread.start()

    def _run(self, call: Callable[[], T]) -> None:
        try:
            self.result = call()
        except Exception as err:  # crosses the thread: whoever joins decides what it means
            self.error = err
        finally:
            self.ended = self._clock()

    def join(self, timeout_s: float) -> bool:
        """True once call() has returned or raised; False while it still runs after timeout_s."""
        self._thread.join(max(timeout_s, 0.0))
        return not self._thread.is_alive()
