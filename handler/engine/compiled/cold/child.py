"""A compile's child process: it stops when the process that started it is gone (a compile
nobody waits for would hold a core and a cache lock for minutes), and exits without tearing
the interpreter down once its work is written."""
from __future__ import annotations

import logging
import os
import signal
import sys
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


def exit_now(code: int) -> None:
    """Exit without tearing the interpreter down: after a compile, tearing down torch's modules
    and Inductor's caches takes a second or more, and the parent waits for this exit. Call it when nothing
    is left to do: what the process wrote is complete, its locks released; logs are flushed here."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
