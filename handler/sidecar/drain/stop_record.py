"""How long TorchServe took to stop, as measured by the drains on this replica's disk, and the
stop reserve the next drain keeps from it.

Every drain that stops TorchServe records the stop step's seconds (the last RECORDED of them are
kept, in a small JSON file beside the compile cache). The next drain keeps
max(measured) + max(1 s, 25%) for the stop (at least FLOOR_S, against a record of stops that
found TorchServe already gone) and, with no measurement yet, the configured stop_reserve_s: the
safe default. With the 1 s margin and the handler's 1 s cut lead, a stream that needs up to
grace - measured stop - 3 s finishes.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from handler.files import write_atomic

log = logging.getLogger(__name__)

RECORDED = 5
NAME = "stop-seconds.json"
FLOOR_S = 2.0  # below every clean TorchServe stop measured (2.45-2.93 s on 2 cores)


def read_stop_seconds(path: Path) -> list[float]:
    """The recorded stop durations; [] when there is no record (or an unreadable one, logged)."""
    try:
        values = json.loads(path.read_text())["stop_seconds"]
        return [float(v) for v in values if float(v) > 0]
    except FileNotFoundError:
        return []
    except (OSError, ValueError, KeyError, TypeError) as err:
        log.warning("stop record %s unreadable (%s): the configured stop reserve is used", path, err)
        return []


def record_stop_seconds(path: Path, seconds: float) -> None:
    kept = [*read_stop_seconds(path), round(seconds, 3)][-RECORDED:]
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps({"stop_seconds": kept}) + "\n")


def stop_reserve(measured: list[float], default_s: float) -> float:
    if not measured:
        return default_s
    slowest = max(measured)
    return max(slowest + max(1.0, 0.25 * slowest), FLOOR_S)
