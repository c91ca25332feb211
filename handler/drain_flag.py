"""The drain flag file as the handler reads it (the sidecar's drain/admission.py writes it).

While the file exists the replica is draining: new requests get a retryable 503 and running
ones carry on. Once the drain's wait is over the sidecar adds `cut_since_epoch` to it: TorchServe
stops next, so running requests are ended at once, each with a retryable error, rather than
reset with the connection.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

CUT_KEY = "cut_since_epoch"


@dataclass(frozen=True)
class DrainFlag:
    path: Path

    def draining(self) -> bool:
        return self.path.exists()

    def cutting(self) -> bool:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return False
        try:
            return CUT_KEY in json.loads(text)
        except json.JSONDecodeError:
            return False  # a flag an operator made by hand (touch): draining, never cutting
