"""What a termination notice is: its kind, its source, its deadline; and whether it drains.

Every watcher (imds.py, gcp.py, azure.py, signals.py) and the /drain endpoint turn what they
saw into a TerminationNotice; board.py collects them.
"""

from __future__ import annotations

import email.utils
import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

Clock = Callable[[], float]  # epoch seconds, time.time in production


class NoticeKind(enum.StrEnum):
    SPOT_INTERRUPTION = "spot_interruption"  # AWS spot/instance-action
    REBALANCE = "rebalance"  # AWS rebalance recommendation: advisory, no deadline promised
    PREEMPTION = "preemption"  # GCP preempted=TRUE or Azure Preempt event
    SIGNAL = "signal"  # SIGTERM/SIGINT, e.g. from the kubelet
    DRAIN_REQUEST = "drain_request"  # POST /drain, e.g. `ts-llm-sidecar drain` as a preStop hook


@dataclass(frozen=True)
class TerminationNotice:
    kind: NoticeKind
    source: str  # "aws" | "gcp" | "azure" | "signal" | "http"
    deadline_epoch: float  # when the machine (or process) is expected to be gone
    detail: dict[str, str] = field(default_factory=dict)

    def seconds_left(self, now: float) -> float:
        return self.deadline_epoch - now

    def to_json(self) -> dict[str, object]:
        return {
            "kind": self.kind.value,
            "source": self.source,
            "deadline_epoch": self.deadline_epoch,
            "detail": dict(self.detail),
        }


def should_drain(notice: TerminationNotice, drain_on_rebalance: bool) -> bool:
    # A rebalance recommendation often never turns into an interruption; draining on it by
    # default is what made NTH nodes stay cordoned forever (NTH #321, #458).
    if notice.kind is NoticeKind.REBALANCE:
        return drain_on_rebalance
    return True


def parse_rfc3339(text: str) -> float:
    """'2026-01-05T18:02:00Z' (AWS spot time, Java Instant) -> epoch seconds."""
    parsed = datetime.fromisoformat(text.strip())
    if parsed.tzinfo is None:
        raise ValueError(f"timestamp without a timezone: {text!r}")
    return parsed.timestamp()


def parse_http_date(text: str) -> float:
    """'Mon, 19 Sep 2016 18:29:47 GMT' (Azure NotBefore) -> epoch seconds."""
    return email.utils.parsedate_to_datetime(text.strip()).timestamp()
