"""How long TorchServe took to stop, as measured by the drains on this replica's disk, and the
stop reserve the next drain keeps from it.

Every drain that stops TorchServe records the stop step's seconds (the last RECORDED of them are
kept, in a small JSON file beside the compile cache). The next drain keeps
max(measured) + max(1 s, 25%) for the stop (at least FLOOR_S, against a record of stops that
found TorchServe already gone) and, with no measurement yet, the configured stop_reserve_s: the
safe default. With the 1 s margin and the handler's 1 s cut lead, a stream that needs up to
grace - measured stop - 3 s finishes.

The record is data from a file or, shared across the fleet, from the cache store
(app/fleet_stop.py): every value is checked to be a number in (0, MAX_S) before it sizes a
reserve, and a record that fails is ignored whole.
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
# No stop worth keeping a reserve for takes this long (AWS gives 120 s of notice in all); a
# larger value is a damaged or forged record, which would hand the whole grace to the stop.
MAX_S = 300.0


def parse_stop_seconds(data: bytes | str) -> list[float]:
    """The stop durations of a record's bytes, the last RECORDED; ValueError unless the record
    is {"stop_seconds": [numbers in (0, MAX_S)]}."""
    document = json.loads(data)
    values = document.get("stop_seconds") if isinstance(document, dict) else None
    if not isinstance(values, list):
        raise ValueError('not {"stop_seconds": [...]}')
    for value in values:
        # bool is an int to Python; NaN and inf fail the range check
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < MAX_S:
            raise ValueError(f"stop seconds must be numbers in (0, {MAX_S:g}), got {value!r}")
    return [float(v) for v in values][-RECORDED:]


def encode_stop_seconds(values: list[float]) -> bytes:
    return (json.dumps({"stop_seconds": values[-RECORDED:]}) + "\n").encode()


def read_stop_seconds(path: Path) -> list[float]:
    """The recorded stop durations; [] when there is no record (or an unreadable one, logged)."""
    try:
        return parse_stop_seconds(path.read_bytes())
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as err:
        log.warning("stop record %s unreadable (%s): the configured stop reserve is used", path, err)
        return []


def write_stop_seconds(path: Path, values: list[float]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, encode_stop_seconds(values))


def record_stop_seconds(path: Path, seconds: float) -> None:
    """Keep `seconds` with the last stops; a stop outside (0, MAX_S) measured nothing useful."""
    if not 0 < round(seconds, 3) < MAX_S:
        log.info("stop of %.3f s not recorded: outside (0, %g)", seconds, MAX_S)
        return
    write_stop_seconds(path, [*read_stop_seconds(path), round(seconds, 3)])


def stop_reserve(measured: list[float], default_s: float) -> float:
    if not measured:
        return default_s
    slowest = max(measured)
    return max(slowest + max(1.0, 0.25 * slowest), FLOOR_S)
