"""Closing admission: the drain flag file that makes the handler refuse new requests.

The handler checks its `drain_flag_file` (model-config `handler:` section, set with
`archive.sh --drain-flag-file PATH`) on every new request; while the file exists a new request
gets a retryable 503 before it is accepted, and requests already generating carry on. The
sidecar's `drain_flag_file` must name the same path, on a filesystem both processes see (in a
pod: a volume mounted in both containers).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from pathlib import Path

from handler.drain_flag import CUT_KEY
from handler.files import write_atomic
from handler.sidecar.errors import ConfigError


def flag_closer(path: Path, clock: Callable[[], float] = time.time) -> Callable[[], None]:
    """The drain's close_admission step: create the flag file (and its directory)."""

    def close_admission() -> None:
        write_flag(path, {"draining_since_epoch": clock()})

    return close_admission


def flag_cutter(path: Path, clock: Callable[[], float] = time.time) -> Callable[[], None]:
    """The end of the in-flight wait: the flag gets `cut_since_epoch`, and the handler ends what is
    still running, each with a retryable error (handler/drain_flag.py reads the key)."""

    def cut_in_flight() -> None:
        try:
            fields = json.loads(path.read_text())
        except (OSError, ValueError):
            fields = {}  # gone or not ours: the cut recreates it
        write_flag(path, {**fields, CUT_KEY: clock()})

    return cut_in_flight


def write_flag(path: Path, fields: dict) -> None:
    try:
        # Atomic: the handler reads it on every step of a drain and must never see half a file.
        write_atomic(path, json.dumps(fields) + "\n")
    except OSError as err:
        raise ConfigError(f"cannot create the drain flag file {path}: {err}; it must be writable "
                          "by the sidecar and on a volume the TorchServe worker sees") from err


def clear_flag(path: Path) -> bool:
    """Remove a flag left by an earlier drain: a fresh sidecar must not start with a replica
    that refuses every request while /ready says 200. True when there was one."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
        return True
    return False
