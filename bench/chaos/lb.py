"""Phase 3 of the chaos run: two replicas behind HAProxy, a spot notice on one of them.

Each replica is a TorchServe with its own sidecar and metadata emulator, token auth off as in
the Kubernetes config (a balancer cannot know each replica's random key). HAProxy checks each
sidecar's `/ready` and retries only what provably never ran (bench/chaos/haproxy.py). N
closed-loop clients send to HAProxy and never retry: every request that does not complete is a
failure the client saw. Replica r0 gets the notice, drains and stops; r1 carries the load.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import requests

from bench.chaos import resume
from bench.chaos.haproxy import Backend, HAProxy, ensure_installed
from bench.chaos.outcomes import Target, sender
from bench.chaos.replica import MODEL, Sidecar, build_archive, raise_spot_notice, replica_with_sidecar
from bench.chaos.timeline import Sample, Sampler
from bench.load import ClosedLoop, Record
from handler.testing.metadata_emulator import MetadataEmulator

NO_TOKEN_AUTH = {"disable_token_authorization": "true"}
NOTICED = "r0"
LONG_STREAMS = 20  # about half reach the noticed replica (leastconn): at least 8 cut


@dataclass
class LbPhase:
    start: float
    haproxy_version: str = ""
    notice_at: float = 0.0
    deadline_at: float = 0.0
    down_at: float | None = None  # HAProxy marked the noticed replica DOWN
    stopped_at: float = 0.0  # the noticed replica's sidecar exited (TorchServe stopped)
    end: float = 0.0
    records: list[Record] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)  # the noticed replica's sidecar
    servers: dict[str, dict[str, str]] = field(default_factory=dict)  # HAProxy's stats at the end
    report: dict[str, object] | None = None
    torchserve_exit_code: int | None = None
    long_streams: list[resume.LongStream] = field(default_factory=list)  # resumable, cut and resumed
    reference: str = ""  # a long stream's uninterrupted text


def lb_phase(args: argparse.Namespace, work: Path, checkpoint: Path) -> LbPhase:
    binary = ensure_installed()
    with contextlib.ExitStack() as stack:
        replicas = []
        for name in ("r0", "r1"):
            flag = work / name / "run" / "draining"  # one flag per replica: the .mar names it
            store = work / name / "store"
            build_archive(checkpoint, store, flag, args.compile, args.batch_size, work / "resume-store")
            settings = functools.partial(_settings, args, flag=flag)  # emulator -> the sidecar's settings
            replicas.append(stack.enter_context(replica_with_sidecar(work / name, store, settings, NO_TOKEN_AUTH)))
        backends = [Backend(name, ts.ports.inference, sidecar.port)
                    for name, (ts, sidecar, _) in zip(("r0", "r1"), replicas)]
        haproxy = HAProxy(binary, backends, work / "haproxy")
        stack.callback(haproxy.stop)
        haproxy.wait_up([b.name for b in backends])
        phase = LbPhase(start=time.time(), haproxy_version=haproxy.version)
        ts, sidecar, emulator = replicas[0]
        run_lb(args, phase, haproxy, sidecar, emulator)
        phase.torchserve_exit_code = ts.process.wait(timeout=30) if ts.process else None
        survivor = replicas[1][0]
        phase.reference = resume.reference(f"http://127.0.0.1:{survivor.ports.inference}/predictions/{MODEL}")
        return phase


def _settings(args: argparse.Namespace, emulator: MetadataEmulator, flag: Path) -> dict[str, object]:
    return {"clouds": "aws", "aws_metadata_url": emulator.url, "poll_interval_s": 2.0,
            "signal_grace_s": args.deadline_s, "drain_margin_s": 3,
            "stop_reserve_s": 5, "quiet_s": 1.0, "quiet_polls": 2, "drain_flag_file": str(flag),
            "key_file": None}


def run_lb(args: argparse.Namespace, phase: LbPhase, haproxy: HAProxy, sidecar: Sidecar,
           emulator: MetadataEmulator) -> None:
    sampler = Sampler(sidecar).start()
    watch = _DownWatch(haproxy, NOTICED).start()
    # A refused request counts as failed here: the client sends its next one after the pause.
    target = Target(f"{haproxy.url}/predictions/{MODEL}", lambda: {})
    load = ClosedLoop(args.clients, sender(target, tuple(args.tokens)), seed=2).start()
    long_streams = None
    try:
        time.sleep(args.warmup_s)
        long_streams = resume.LongStreams(target.url, LONG_STREAMS).start(until=time.time() + args.deadline_s + 600)
        time.sleep(3.0)  # admitted, streaming, when the notice comes
        phase.notice_at, phase.deadline_at = raise_spot_notice(emulator, args.deadline_s, f" on {NOTICED} behind HAProxy")
        sidecar.process.wait(timeout=args.deadline_s + 60)
        phase.stopped_at = time.time()
        time.sleep(args.tail_s)  # the survivor carries the load
    finally:
        load.stop()
        phase.down_at = watch.stop()
        phase.samples = sampler.stop()
        phase.end = time.time()
        phase.records = load.snapshot()
        phase.report = sidecar.report()
        phase.servers = haproxy.servers()
        if long_streams is not None:  # the resumed ones go on on the survivor
            phase.long_streams = long_streams.join(until=time.time() + 600)


class _DownWatch:
    """When HAProxy first reported `server` as anything but UP."""

    def __init__(self, haproxy: HAProxy, server: str, interval_s: float = 0.1) -> None:
        self.haproxy, self.server, self.interval_s = haproxy, server, interval_s
        self.down_at: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="haproxy-watch", daemon=True)

    def start(self) -> _DownWatch:
        self._thread.start()
        return self

    def stop(self) -> float | None:
        self._stop.set()
        self._thread.join(timeout=5)
        return self.down_at

    def _run(self) -> None:
        while self.down_at is None and not self._stop.is_set():
            try:
                status = self.haproxy.servers()[self.server]["status"]
            except (requests.RequestException, KeyError):
                status = None
            if status is not None and not status.startswith("UP"):
                self.down_at = time.time()
            self._stop.wait(self.interval_s)
