"""Phase 3 of the chaos run: two replicas behind HAProxy, a spot notice on one of them.

Each replica is a TorchServe with its own sidecar and metadata emulator, token auth off as in
the Kubernetes config (a balancer cannot know each replica's random key), and resume records
sealed with one fleet secret in one shared store, as the deployment has them. HAProxy checks each
sidecar's `/ready` and retries only what provably never ran (bench/chaos/haproxy.py). N
closed-loop clients send to HAProxy and never retry: every request that does not complete is a
failure the client saw. Replica r0 gets the notice, drains and stops; r1 carries the load. Then
the resume capability is checked on r1 (bench/chaos/security.py), and every long stream's request
runs uncut on a freshly started replica, r2, for its reference (bench/chaos/resume.py).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import requests

from bench.chaos import resume, security
from bench.chaos.haproxy import Backend, HAProxy, ensure_installed
from bench.chaos.outcomes import Target, sender
from bench.chaos.replica import (
    MODEL,
    Sidecar,
    build_archive,
    raise_spot_notice,
    replica_with_sidecar,
    start_replica_torchserve,
    stop_torchserve,
)
from bench.chaos.timeline import Sample, Sampler
from bench.load import ClosedLoop, Record
from handler.testing.metadata_emulator import MetadataEmulator
from handler.torchserve.launch import TorchServe

NO_TOKEN_AUTH = {"disable_token_authorization": "true"}
NOTICED = "r0"
# sent to the noticed replica, 48 of its 64 slots (n = 2 takes two): at least 32 cut
LONG_STREAMS = {"native": 28, "n2": 4, "tools": 4, "grpc": 4, "non_streaming": 4}
# Each replica's slots: the long streams beside the clients' requests, all running when the notice
# comes (a stream still queued in TorchServe is refused, not cut), and on the survivor once resumed.
LB_BATCH_SIZE = 64


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
    pinned: dict[str, dict[str, str]] = field(default_factory=dict)  # ...of its `pinned` frontend's backend
    report: dict[str, object] | None = None
    torchserve_exit_code: int | None = None
    long_streams: list[resume.LongStream] = field(default_factory=list)  # resumable, cut and resumed
    reference: dict[str, str] = field(default_factory=dict)  # each long stream's text, uncut on a fresh replica
    security: dict[str, object] = field(default_factory=dict)  # bench/chaos/security.py's checks


def lb_phase(args: argparse.Namespace, work: Path, checkpoint: Path) -> LbPhase:
    binary = ensure_installed()
    with contextlib.ExitStack() as stack:
        replicas = []
        secret = _fleet_secret(work / "resume-secret")
        for name in ("r0", "r1"):
            flag = work / name / "run" / "draining"  # one flag per replica: the .mar names it
            store = work / name / "store"
            build_archive(checkpoint, store, flag, args.compile, max(args.batch_size, LB_BATCH_SIZE),
                          work / "resume-store", secret)
            settings = functools.partial(_settings, args, flag=flag)  # emulator -> the sidecar's settings
            replicas.append(stack.enter_context(replica_with_sidecar(work / name, store, settings, NO_TOKEN_AUTH)))
        backends = [Backend(name, ts.ports.inference, sidecar.port)
                    for name, (ts, sidecar, _) in zip(("r0", "r1"), replicas)]
        haproxy = HAProxy(binary, backends, work / "haproxy")
        stack.callback(haproxy.stop)
        haproxy.wait_up([b.name for b in backends])
        phase = LbPhase(start=time.time(), haproxy_version=haproxy.version)
        ts, sidecar, emulator = replicas[0]
        run_lb(args, phase, haproxy, (ts, sidecar, emulator), replicas[1][0])
        phase.torchserve_exit_code = ts.process.wait(timeout=30) if ts.process else None
        survivor = f"http://127.0.0.1:{replicas[1][0].ports.inference}/predictions/{MODEL}"
        phase.security = {"edited_record": security.edited_record_accepted(work / "resume-store", survivor),
                          "public_id": security.resume_token_in_public_id(survivor + "/1.0/v1/chat/completions")}
        fresh = start_replica_torchserve(work / "r1" / "store", work / "r2" / "ts", NO_TOKEN_AUTH)
        try:
            phase.reference = resume.reference(f"http://127.0.0.1:{fresh.ports.inference}/predictions/{MODEL}",
                                               LONG_STREAMS)
        finally:
            stop_torchserve(fresh)
        return phase


def _fleet_secret(path: Path) -> Path:
    """The fleet's resume secret (a Kubernetes Secret in the deployment): 32 random bytes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(os.urandom(32))
    path.chmod(0o600)
    return path


def _settings(args: argparse.Namespace, emulator: MetadataEmulator, flag: Path) -> dict[str, object]:
    return {"clouds": "aws", "aws_metadata_url": emulator.url, "poll_interval_s": 2.0,
            "signal_grace_s": args.deadline_s, "drain_margin_s": 3,
            "stop_reserve_s": 5, "quiet_s": 1.0, "quiet_polls": 2, "drain_flag_file": str(flag),
            "key_file": None}


def run_lb(args: argparse.Namespace, phase: LbPhase, haproxy: HAProxy,
           noticed: tuple[TorchServe, Sidecar, MetadataEmulator], survivor: TorchServe) -> None:
    ts, sidecar, emulator = noticed
    sampler = Sampler(sidecar).start()
    watch = _DownWatch(haproxy, NOTICED).start()
    # A refused request counts as failed here: the client sends its next one after the pause.
    target = Target(f"{haproxy.url}/predictions/{MODEL}", lambda: {})
    load = ClosedLoop(args.clients, sender(target, tuple(args.tokens)), seed=2).start()
    long_streams = None
    try:
        time.sleep(args.warmup_s)
        targets = resume.Targets(f"http://127.0.0.1:{ts.ports.inference}/predictions/{MODEL}", target.url,
                                 f"{haproxy.pinned_url}/predictions/{MODEL}", f"127.0.0.1:{ts.ports.grpc_inference}",
                                 f"127.0.0.1:{survivor.ports.grpc_inference}")
        long_streams = resume.LongStreams(targets, LONG_STREAMS).start(until=time.time() + args.deadline_s + 600)
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
        phase.servers, phase.pinned = haproxy.servers(), haproxy.servers("first_up")
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
