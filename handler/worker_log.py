"""What a TorchServe worker's log (logs/model_log.log) says about a failed load."""
from __future__ import annotations

import re
from pathlib import Path

# What TorchServe's worker wraps a failed load in: it names no cause.
_WRAPPERS = re.compile(r"Unknown exception|Backend worker|Load model failed|PredictionException")
MODEL_LOG = Path("logs") / "model_log.log"  # under TorchServe's LOG_LOCATION, or its working directory
_TAIL_BYTES = 1 << 20  # a crash loop repeats its traceback: the last MiB holds a whole one


def first_cause(model_log_lines: list[str]) -> str | None:
    """The first exception line ("Type: message") a worker logged that is not TorchServe's
    wrapper around it: the cause of a load failure, not `RuntimeError: 500 - Unknown exception`."""
    for line in model_log_lines:
        text = re.sub(r"^.*MODEL_LOG - ", "", line).strip()
        if re.match(r"^[\w.]*(Error|Exception): ", text) and not _WRAPPERS.search(text):
            return text
    return None


def first_cause_in(path: Path) -> str | None:
    """first_cause of the end of a model_log.log; None when it is absent or names no cause."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - _TAIL_BYTES))
            return first_cause(f.read().decode(errors="replace").splitlines())
    except FileNotFoundError:
        return None
