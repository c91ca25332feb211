"""What the next side-by-side cold compile should expect, for its time estimate
(handler.engine.compiled.compile_progress.SideBySide): this machine's last one of a model as deep, kept
in Inductor's cache dir beside the kernels it built, else a reference machine's, scaled to the
model and the cores."""
from __future__ import annotations

import json
import logging
from pathlib import Path

from handler.files import write_atomic

log = logging.getLogger(__name__)

FILE = "compile-times.json"  # {"<layers>": {part: seconds from the start to its end}}

# The reference: the compile process alone (python -m handler.engine.compiled.cold.in_background), default
# model (30 layers), three processes side by side on 2 cores (Zen 4), one run.
REFERENCE = {"decode, batch 1": 103.0, "decode, general": 108.0, "prefill": 111.0}
REFERENCE_LAYERS = 30
REFERENCE_CORES = 2


def expected(folder: Path, parts: tuple[str, ...], layers: int, cores: int) -> tuple[dict[str, float], str]:
    """Each part's expected seconds and where they come from. Compile time grows with the layers
    (Inductor compiles each one; a small model's is mostly fixed costs, so this machine's own
    times count for models as deep only); the parts share the cores, and with fewer cores than
    parts each runs that much slower."""
    last = _load(folder / FILE, parts, layers)
    if last is not None:
        return last, "this machine's last compile"
    slower = _share(REFERENCE_CORES, len(parts)) / _share(cores, len(parts))
    return ({p: REFERENCE[p] * layers / REFERENCE_LAYERS * slower for p in parts},
            f"a {REFERENCE_CORES}-core reference machine")


def save(folder: Path, layers: int, seconds: dict[str, float]) -> None:
    path = folder / FILE
    try:
        recorded = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        recorded = {}
    recorded = recorded if isinstance(recorded, dict) else {}
    write_atomic(path, json.dumps({**recorded, str(layers): seconds}))


def _share(cores: int, parts: int) -> float:
    return min(1.0, cores / parts)  # of a core, for each part


def _load(path: Path, parts: tuple[str, ...], layers: int) -> dict[str, float] | None:
    """The seconds recorded at path for a model of `layers`, if there is a time for every part."""
    try:
        seconds = {p: float(json.loads(path.read_text())[str(layers)][p]) for p in parts}
    except (FileNotFoundError, KeyError):
        return None
    except (ValueError, TypeError) as e:  # it only sizes an estimate: the compile goes on
        log.warning("compile times at %s unreadable (%r); estimating from the reference machine", path, e)
        return None
    if min(seconds.values()) <= 0:
        log.warning("compile times at %s out of range; estimating from the reference machine", path)
        return None
    return seconds
