"""One replica for the chaos run, from real parts: a .mar built with a drain flag, TorchServe
started by handler.torchserve.launch, `ts-llm-sidecar watch` as its own process, the metadata emulator,
and moto's S3 server holding the compile cache. Everything is on loopback; `Replica.close`
stops what was started, also after a failure.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests
import yaml

from bench.common import REPO
from handler.packing.archive import build_mar
from handler.packing.model_config import ServingOptions
from handler.testing.metadata_emulator import MetadataEmulator
from handler.testing.moto import FAKE_AWS_ENV, REGION, MotoServer, start_moto_server
from handler.torchserve.launch import Ports, TorchServe, free_port, start_torchserve

MODEL = "llm"
BUCKET, PREFIX = "chaos-compile-cache", "ts-llm/llm"


def build_archive(checkpoint: Path, store: Path, flag: Path, compile_mode: str,
                  batch_size: int, resume_store: Path | None = None, resume_secret: Path | None = None) -> Path:
    # One intra-op thread: on a small machine shared with other work, two OpenMP threads
    # contending for two cores make every decode step an order of magnitude slower.
    handler = {"compile": compile_mode, "max_seq_len": 256,
               "max_new_tokens_cap": 64, "default_max_new_tokens": 16, "threads": 1,
               "served_model_name": MODEL, "drain_flag_file": str(flag)}
    if resume_store is not None:  # resumable streams, long enough to outlive a notice
        handler |= {"resume_store": str(resume_store), "max_seq_len": 1024, "max_new_tokens_cap": 1000}
    if resume_secret is not None:  # records sealed with the fleet's secret, as the deployment has them
        handler |= {"resume_secret_file": str(resume_secret)}
    return build_mar(checkpoint, MODEL, store,
                     ServingOptions("continuous", batch_size=batch_size, handler=handler))


def write_compile_cache(cache_dir: Path, checkpoint: Path) -> dict[str, object]:
    """A small but real cache: artifact files plus cache-key.json (the key-file contract), so
    the drain's publish step has something to upload and S3 something to show."""
    from handler.cache.key import current_key, digest_files

    cache_dir.mkdir(parents=True, exist_ok=True)
    for name in ("fxgraph/graph-0.bin", "inductor/kernel-0.so", "inductor/kernel-1.so"):
        path = cache_dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(256 * 1024))
    key = current_key(digest_files(checkpoint.glob("*.safetensors")),
                      {"chaos": True, "dtype": "bfloat16"}, "cpu")
    (cache_dir / "cache-key.json").write_text(json.dumps(key.describe()))
    return key.describe()


@dataclass
class Sidecar:
    process: subprocess.Popen[bytes]
    port: int
    log_path: Path
    report_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def ready(self) -> int | None:
        try:
            return requests.get(self.url + "/ready", timeout=2).status_code
        except requests.RequestException:
            return None

    def in_flight(self) -> float | None:
        """ts_llm_requests_in_flight from the sidecar's /metrics (TorchServe's view)."""
        try:
            text = requests.get(self.url + "/metrics", timeout=2).text
        except requests.RequestException:
            return None
        for line in text.splitlines():
            if line.startswith("ts_llm_requests_in_flight{"):
                return float(line.rsplit(" ", 1)[1])
        return None

    def report(self) -> dict[str, object] | None:
        try:
            doc: dict[str, object] = json.loads(self.report_path.read_text())
        except (OSError, ValueError):
            return None
        return doc


def start_sidecar(work: Path, ts: TorchServe, settings: dict[str, object]) -> Sidecar:
    port = free_port()
    config = {"model_name": MODEL, "management_url": ts.management_url,
              "key_file": str(ts.workdir / "key_file.json"),
              "metrics_url": ts.metrics_url + "/metrics", "listen_host": "127.0.0.1",
              "listen_port": port, "stop_method": "pid",
              "torchserve_pid_file": str(ts.workdir / "tmp" / ".model_server.pid"),
              "report_file": str(work / "drain-report.json"), **settings}
    config_path = work / "sidecar.yaml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    log_path = work / "sidecar.log"
    with log_path.open("wb") as log:  # the child keeps its own descriptor
        process = subprocess.Popen(
            [str(Path(sys.executable).parent / "ts-llm-sidecar"), "watch", "--config",
             str(config_path)], stdout=subprocess.DEVNULL, stderr=log,
            env={**os.environ, **FAKE_AWS_ENV}, start_new_session=True)
    sidecar = Sidecar(process, port, log_path, Path(str(config["report_file"])))
    _wait(lambda: sidecar.ready() is not None or process.poll() is not None, 30,
          f"the sidecar to listen (see {log_path})")
    if process.poll() is not None:
        raise RuntimeError(f"sidecar exited with {process.returncode}; see {log_path}")
    return sidecar


def start_replica_torchserve(store: Path, work: Path, extra_props: dict[str, str] | None = None) -> TorchServe:
    # TEMP (TorchServe reads it, not TMPDIR, for java.io.tmpdir) keeps the worker sockets in
    # this instance's own directory, next to its pid file.
    ts = start_torchserve(store, {MODEL: f"{MODEL}.mar"}, REPO / "config.properties",
                          work, Ports.free(), extra_props=extra_props, env={"TEMP": str(work / "tmp")})
    try:
        ts.wait_ready(MODEL, timeout=600)
    except Exception:
        stop_torchserve(ts)
        raise
    return ts


def raise_spot_notice(emulator: MetadataEmulator, deadline_s: float, label: str) -> tuple[float, float]:
    """Raise a spot interruption on the emulator; (when it was raised, its deadline), epochs."""
    from handler.sidecar.notice.termination import parse_rfc3339

    raised_at = time.time()
    notice = emulator.raise_spot_interruption("terminate", deadline_s)
    print(f"chaos: spot interruption raised{label}, deadline {notice['time']}", flush=True)
    return raised_at, parse_rfc3339(notice["time"])


@contextmanager
def replica_with_sidecar(work: Path, store: Path, settings: Callable[[MetadataEmulator], dict[str, object]],
                         extra_props: dict[str, str] | None = None) -> Iterator[tuple[TorchServe, Sidecar, MetadataEmulator]]:
    """TorchServe, the metadata emulator and a sidecar watching it (settings from the emulator),
    yielded once the sidecar reports ready; all three are always stopped."""
    ts = start_replica_torchserve(store, work / "ts", extra_props)
    emulator = MetadataEmulator().start()
    sidecar: Sidecar | None = None
    try:
        sidecar = start_sidecar(work, ts, settings(emulator))
        _wait(lambda: sidecar.ready() == 200, 60, "the sidecar to report ready")
        yield ts, sidecar, emulator
    finally:
        if sidecar is not None:
            stop_process(sidecar.process)
        stop_torchserve(ts)
        emulator.stop()


def stop_torchserve(ts: TorchServe) -> None:
    if ts.process is not None and ts.process.poll() is None:
        ts.stop(timeout=30)


def stop_process(process: subprocess.Popen[bytes], timeout_s: float = 30.0) -> int:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)
    return int(process.returncode)


def start_moto() -> MotoServer:
    """moto's S3 on loopback holding the chaos bucket, with its fake credentials in this process."""
    os.environ.update(FAKE_AWS_ENV)
    moto = start_moto_server()
    s3(moto).create_bucket(Bucket=BUCKET)
    return moto


def s3(moto: MotoServer) -> Any:  # a boto3 client
    import boto3

    return boto3.client("s3", endpoint_url=moto.endpoint_url, region_name=REGION)


def published_objects(moto: MotoServer, digest: str) -> list[dict[str, object]]:
    listed = s3(moto).list_objects_v2(Bucket=BUCKET, Prefix=f"{PREFIX}/{digest}/")
    return [{"key": o["Key"], "size": o["Size"], "last_modified": o["LastModified"].timestamp()}
            for o in listed.get("Contents", [])]


def _wait(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    give_up = time.monotonic() + timeout_s
    while time.monotonic() < give_up:
        if condition():
            return
        time.sleep(0.1)
    raise TimeoutError(f"timed out after {timeout_s} s waiting for {what}")
