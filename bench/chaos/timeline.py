"""What the chaos run plots: the sidecar's view sampled while it runs (readiness, TorchServe's
in-flight count) and the clients' view rebuilt afterwards from their records."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from bench.chaos.replica import Sidecar
from bench.load import Record


@dataclass
class Sample:
    t: float
    ready: int | None  # /ready status code; None: the sidecar is not answering
    server_in_flight: float | None  # ts_llm_requests_in_flight on the sidecar's /metrics


@dataclass
class Sampler:
    sidecar: Sidecar
    interval_s: float = 0.25
    samples: list[Sample] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Sampler:
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> list[Sample]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        return self.samples

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append(Sample(time.time(), self.sidecar.ready(),
                                       self.sidecar.in_flight()))
            self._stop.wait(self.interval_s)


def client_curves(records: list[Record], start: float, end: float,
                  step_s: float = 0.25) -> dict[str, list[float]]:
    """Per time step: requests open at the client, and of those, accepted (200 received)."""
    times: list[float] = []
    open_: list[float] = []
    accepted: list[float] = []
    t = start
    while t <= end:
        live = [r for r in records if r.start <= t < (r.end or end)]
        times.append(t - start)
        open_.append(len(live))
        accepted.append(sum(1 for r in live if r.status == 200 and r.status_at is not None
                            and r.status_at <= t))
        t += step_s
    return {"t": times, "open": open_, "accepted": accepted}
