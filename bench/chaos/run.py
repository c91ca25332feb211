"""Chaos run: a spot interruption under sustained load, then a worker killed mid-load.

    .venv/bin/python -m bench.chaos [--clients 32] [--deadline-s 30] [--compile eager]

Phase 1 (spot): TorchServe serves an eager .mar built with a drain flag; `ts-llm-sidecar
watch` runs beside it against the metadata emulator, with moto's S3 as the compile-cache store.
N clients send streaming and non-streaming requests in a closed loop. The emulator raises a
spot interruption with a short deadline; the clients keep sending. Every request must end
completed, or refused before it was accepted (503 / connection refused); the cache must be in
S3 before the deadline; TorchServe must exit cleanly.

Phase 2 (worker kill): a fresh TorchServe + sidecar under the same load; the model worker is
SIGKILLed; what the clients saw, and how long until a worker is READY and a request succeeds.

Phase 3 (load balancer): two replicas behind HAProxy (installed when missing), a spot notice on
one, clients that never retry: every failure is one they saw (bench/chaos/lb.py).

Writes docs/results/chaos.json, docs/results/chaos.png and docs/chaos.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench.chaos.lb import lb_phase
from bench.chaos.outcomes import Target, sender
from bench.chaos.replica import (
    BUCKET,
    MODEL,
    PREFIX,
    Sidecar,
    build_archive,
    published_objects,
    raise_spot_notice,
    replica_with_sidecar,
    start_moto,
    stop_process,
    write_compile_cache,
)
from bench.chaos.report import write_outputs
from bench.chaos.timeline import Sample, Sampler
from bench.common import REPO
from bench.load import ClosedLoop, Record, as_rows
from handler.engine.convert import ensure_default_checkpoint
from handler.testing.metadata_emulator import MetadataEmulator
from handler.testing.moto import MotoServer
from handler.torchserve.errors import TorchServeError
from handler.torchserve.launch import TorchServe

CHECKPOINT = REPO / "artifacts" / "checkpoints" / "smollm2-135m-instruct"


@dataclass
class SpotPhase:
    start: float
    notice_at: float = 0.0
    deadline_at: float = 0.0
    sidecar_exit_at: float = 0.0
    end: float = 0.0
    records: list[Record] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    report: dict[str, object] | None = None
    sidecar_exit_code: int | None = None
    torchserve_exit_code: int | None = None
    cache_key: dict[str, object] = field(default_factory=dict)
    s3_objects: list[dict[str, object]] = field(default_factory=list)


@dataclass
class KillPhase:
    start: float
    kill_at: float = 0.0
    killed_pid: int = 0
    ready_at: float | None = None
    first_success_at: float | None = None
    end: float = 0.0
    records: list[Record] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    torchserve_exit_code: int | None = None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.chaos", description=__doc__.split("\n")[0])
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--deadline-s", type=float, default=30.0, help="spot notice to deadline")
    p.add_argument("--warmup-s", type=float, default=15.0, help="load before the notice/kill")
    p.add_argument("--tail-s", type=float, default=4.0, help="load after TorchServe stopped")
    p.add_argument("--compile", choices=["eager", "inductor"], default="eager")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--tokens", type=int, nargs=2, default=(4, 16), metavar=("MIN", "MAX"))
    p.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="ts-llm-chaos-"))
    print(f"chaos: work directory {work}", flush=True)
    checkpoint = ensure_default_checkpoint(CHECKPOINT)
    flag = work / "run" / "draining"
    store = work / "store"
    build_archive(checkpoint, store, flag, args.compile, args.batch_size)
    moto = start_moto()
    try:
        spot = spot_phase(args, work / "spot", store, flag, checkpoint, moto)
        kill = kill_phase(args, work / "kill", store, flag)
        lb = lb_phase(args, work / "lb", checkpoint)
    finally:
        moto.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    if args.keep:
        for name, phase in (("spot", spot), ("kill", kill), ("lb", lb)):
            (work / f"records-{name}.json").write_text(json.dumps(as_rows(phase.records)))
    results = write_outputs(args, spot, kill, lb)
    print(f"chaos: requests_sent={results['requests_sent']} "
          f"requests_lost={results['requests_lost']} drain_seconds={results['drain_seconds']} "
          f"deadline_seconds={results['deadline_seconds']} "
          f"cache_published={results['cache_published']} "
          f"worker_kill.recovery_seconds={results['worker_kill']['recovery_seconds']} "
          f"lb.client_visible_failures={results['lb']['client_visible_failures']}")
    ok = results["requests_lost"] == 0 and results["drain_within_deadline"]
    return 0 if ok and results["lb"]["client_visible_failures"] == 0 else 1


# ---- phase 1: spot interruption

def spot_phase(args: argparse.Namespace, work: Path, store: Path, flag: Path, checkpoint: Path,
               moto: MotoServer) -> SpotPhase:
    work.mkdir(parents=True)
    cache_key = write_compile_cache(work / "compile-cache", checkpoint)

    def settings(emulator: MetadataEmulator) -> dict[str, object]:
        return spot_settings(args, emulator, moto, flag, work)

    with replica_with_sidecar(work, store, settings) as (ts, sidecar, emulator):
        phase = SpotPhase(start=time.time(), cache_key=cache_key)
        run_spot(args, phase, ts, sidecar, emulator)
        phase.s3_objects = published_objects(moto, str(cache_key["digest"]))
        return phase


def spot_settings(args: argparse.Namespace, emulator: MetadataEmulator, moto: MotoServer, flag: Path,
                  work: Path) -> dict[str, object]:
    return {"clouds": "aws", "aws_metadata_url": emulator.url,
            "poll_interval_s": 2.0,  # what aws-node-termination-handler polls at
            "drain_margin_s": 3, "stop_reserve_s": 5, "quiet_s": 1.0,
            "quiet_polls": 2, "signal_grace_s": args.deadline_s, "drain_flag_file": str(flag),
            "cache_store": f"s3://{BUCKET}/{PREFIX}", "cache_dir": str(work / "compile-cache"),
            "aws_endpoint_url": moto.endpoint_url, "aws_region": "us-east-1",
            # Measure the drain-time publish: with publish-after-start the artifact would already be up.
            "publish_after_start": False}


def run_spot(args: argparse.Namespace, phase: SpotPhase, ts: TorchServe, sidecar: Sidecar,
             emulator: MetadataEmulator) -> None:
    sampler = Sampler(sidecar).start()
    load = ClosedLoop(args.clients, sender(target(ts), tuple(args.tokens))).start()
    try:
        time.sleep(args.warmup_s)
        phase.notice_at, phase.deadline_at = raise_spot_notice(emulator, args.deadline_s, "")
        phase.sidecar_exit_code = sidecar.process.wait(timeout=args.deadline_s + 60)
        phase.sidecar_exit_at = time.time()
        phase.torchserve_exit_code = ts.process.wait(timeout=30) if ts.process else None
        time.sleep(args.tail_s)  # clients keep knocking on a stopped server
    finally:
        load.stop()
        phase.samples = sampler.stop()
        phase.end = time.time()
        phase.records = load.snapshot()
        phase.report = sidecar.report()


# ---- phase 2: a worker killed mid-load

def kill_phase(args: argparse.Namespace, work: Path, store: Path, flag: Path) -> KillPhase:
    work.mkdir(parents=True)

    def settings(emulator: MetadataEmulator) -> dict[str, object]:
        return {"clouds": "aws", "aws_metadata_url": emulator.url, "poll_interval_s": 2.0,
                "signal_grace_s": 30, "drain_margin_s": 3,
                "stop_reserve_s": 6, "drain_flag_file": str(flag)}

    with replica_with_sidecar(work, store, settings) as (ts, sidecar, _):
        phase = KillPhase(start=time.time())
        run_kill(args, phase, ts, sidecar)
        # SIGTERM: the sidecar's own drain stops TorchServe, as a kubelet's would.
        stop_process(sidecar.process, timeout_s=60)
        phase.torchserve_exit_code = ts.process.wait(timeout=30) if ts.process else None
        return phase


def run_kill(args: argparse.Namespace, phase: KillPhase, ts: TorchServe,
             sidecar: Sidecar) -> None:
    sampler = Sampler(sidecar).start()
    load = ClosedLoop(args.clients, sender(target(ts), tuple(args.tokens)), seed=1).start()
    try:
        time.sleep(args.warmup_s)
        phase.killed_pid = worker_pid(ts)
        phase.kill_at = time.time()
        os.kill(phase.killed_pid, signal.SIGKILL)
        print(f"chaos: SIGKILL to worker pid {phase.killed_pid}", flush=True)
        phase.ready_at = _wait_time(lambda: worker_ready_again(ts, phase.killed_pid), 300)
        phase.first_success_at = _wait_time(lambda: first_success(load, phase.kill_at), 300)
        time.sleep(5)  # and the load carries on
    finally:
        load.stop()
        phase.samples = sampler.stop()
        phase.end = time.time()
        phase.records = load.snapshot()


def worker_pid(ts: TorchServe) -> int:
    (worker,) = ts.client(MODEL).describe().workers
    return worker.process()


def worker_ready_again(ts: TorchServe, old_pid: int) -> bool:
    try:
        workers = ts.client(MODEL).describe().workers
    except TorchServeError:  # the frontend may be busy; try again
        return False
    return any(w.status == "READY" and int(w.pid or 0) != old_pid for w in workers)


def first_success(load: ClosedLoop, since: float) -> float | None:
    done = [r.end for r in load.snapshot() if r.start >= since and r.outcome == "completed"]
    return min(done) if done else None


def target(ts: TorchServe) -> Target:
    return Target(f"{ts.inference_url}/predictions/{MODEL}", ts.headers)


def _wait_time(probe: Callable[[], object], timeout_s: float) -> float | None:
    """Poll `probe` until truthy; a float result is the event's own time, else now."""
    give_up = time.time() + timeout_s
    while time.time() < give_up:
        result = probe()
        if result:
            return result if isinstance(result, float) else time.time()
        time.sleep(0.1)
    return None


def _until(condition: Callable[[], object], timeout_s: float, what: str) -> None:
    if _wait_time(condition, timeout_s) is None:
        raise TimeoutError(f"timed out after {timeout_s} s waiting for {what}")


if __name__ == "__main__":
    sys.exit(main())
