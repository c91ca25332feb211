"""What every watcher looks like, and the loop that runs one in its own thread."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Protocol

from handler.sidecar.errors import MetadataError
from handler.sidecar.notice.termination import TerminationNotice

log = logging.getLogger(__name__)

OnNotice = Callable[[TerminationNotice], None]
OnError = Callable[[str, MetadataError], None]


class Watcher(Protocol):
    name: str  # "aws" | "gcp" | "azure" | "signal": the metrics label and the notice source

    def poll(self) -> TerminationNotice | None:
        """One look at the source; a notice is returned once, then never again."""
        ...


def run_watcher(watcher: Watcher, on_notice: OnNotice, stop: threading.Event,
                interval_s: float, on_error: OnError | None = None) -> None:
    """Poll until `stop` is set. Metadata failures are logged and counted, never fatal:
    three identical errors in a row crashed NTH (aws-node-termination-handler #668, #916),
    and a crashed watcher is worse than a late one."""
    while not stop.is_set():
        try:
            notice = watcher.poll()
        except MetadataError as err:
            log.warning("%s watcher: %s", watcher.name, err)
            if on_error is not None:
                on_error(watcher.name, err)
            notice = None
        if notice is not None:
            on_notice(notice)
        stop.wait(interval_s)
