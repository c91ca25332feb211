"""A child process that stops when the process that started it is gone (a compile nobody waits
for would hold a core and a cache lock for minutes)."""
from __future__ import annotations

import logging
import os
import signal
import threading
import time

log = logging.getLogger(__name__)

PARENT_POLL_S = 1.0
EXIT_GRACE_S = 10.0  # after the parent is gone: time for the main thread's cleanup before a hard exit


def watch_parent(pid: int, poll_s: float = PARENT_POLL_S) -> threading.Thread:
    """Interrupt the main thread (SIGINT, whose KeyboardInterrupt runs its `finally` blocks, which
    remove what it was writing) once `pid` is no longer this process's parent; exit hard if that
    does not end it."""
    # Python's own handler: a worker started with SIGINT ignored would pass that on.
    signal.signal(signal.SIGINT, signal.default_int_handler)

    def watch() -> None:
        while os.getppid() == pid:
            time.sleep(poll_s)
        log.error("the process that started this one (pid %d) is gone; stopping", pid)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(EXIT_GRACE_S)
        os._exit(1)

    thread = threading.Thread(target=watch, name="parent-watch", daemon=True)
    thread.start()
    return thread
