"""The sidecar against a real TorchServe: a spot notice drains streams in flight, refuses new
requests before accepting them, and stops TorchServe with nothing left in flight.

Real parts only: an eager .mar of the default model built with a drain flag, TorchServe started
by handler.torchserve.launch (token auth on), the metadata emulator over HTTP, the sidecar's `watch`
loop with stop_method=pid. Bounded: the model loads in ~10 s, the drain takes a few seconds.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import requests

from handler.packing.archive import build_mar
from handler.packing.model_config import ServingOptions
from handler.sidecar.app.sidecar import Sidecar
from handler.sidecar.config import config_from_mapping
from handler.sidecar.drain.report import DrainReport
from handler.testing.metadata_emulator import MetadataEmulator
from handler.torchserve.launch import Ports, TorchServe, start_torchserve

REPO = Path(__file__).resolve().parents[3]
MODEL = "llm"
STREAMS = 3
# Long enough to be mid-generation when the notice comes, short enough for a bounded test.
STREAM_TOKENS = 32

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


@dataclass
class Replica:
    ts: TorchServe
    flag: Path

    @property
    def pid_file(self) -> Path:
        # TorchServe keeps its pid file in its TMPDIR; the launcher gives each instance its own.
        return self.ts.workdir / "tmp" / ".model_server.pid"


@pytest.fixture(scope="session")
def eager_store(tmp_path_factory: pytest.TempPathFactory,
                default_checkpoint: Path) -> tuple[Path, Path]:
    """An eager (ready in seconds) .mar whose handler refuses new work while `flag` exists."""
    tmp = tmp_path_factory.mktemp("sidecar_e2e")
    flag = tmp / "run" / "draining"
    handler = {"dtype": "bfloat16", "compile": "eager", "max_seq_len": 256,
               "max_new_tokens_cap": 64, "default_max_new_tokens": 16, "served_model_name": MODEL,
               "drain_flag_file": str(flag)}
    store = tmp / "model_store"
    build_mar(default_checkpoint, MODEL, store,
              ServingOptions("continuous", batch_size=8, handler=handler))
    return store, flag


@pytest.fixture
def replica(eager_store: tuple[Path, Path], tmp_path: Path) -> Iterator[Replica]:
    store, flag = eager_store
    work = tmp_path / "ts"
    # TEMP (TorchServe reads it, not TMPDIR, for java.io.tmpdir) keeps the worker sockets in
    # this instance's own directory, next to its pid file.
    ts = start_torchserve(store, {MODEL: f"{MODEL}.mar"}, REPO / "config.properties", work,
                          Ports.free(), env={"TEMP": str(work / "tmp")})
    try:
        ts.wait_ready(MODEL, timeout=120)
        yield Replica(ts, flag)
    finally:
        if ts.process is not None and ts.process.poll() is None:
            ts.stop(timeout=30)


@dataclass
class Stream:
    """One streaming request in a thread: accepted once its first NDJSON line arrived."""

    status: int | None = None
    lines: list[dict[str, object]] = field(default_factory=list)
    last_line_epoch: float = 0.0
    error: str | None = None
    accepted: threading.Event = field(default_factory=threading.Event)
    finished: threading.Event = field(default_factory=threading.Event)

    def run(self, ts: TorchServe) -> None:
        try:
            with requests.post(f"{ts.inference_url}/predictions/{MODEL}", headers=ts.headers(),
                               json={"prompt": "Write a long story about a lighthouse keeper.",
                                     "max_new_tokens": STREAM_TOKENS, "stream": True,
                                     "ignore_eos": True},
                               stream=True, timeout=60) as response:
                self.status = response.status_code
                for line in response.iter_lines():
                    if line:
                        self.lines.append(json.loads(line))
                        self.last_line_epoch = time.time()
                        self.accepted.set()
        except (requests.RequestException, ValueError) as err:
            self.error = f"{type(err).__name__}: {err}"
        finally:
            self.accepted.set()
            self.finished.set()

    @property
    def complete(self) -> bool:
        return self.status == 200 and bool(self.lines) and \
            self.lines[-1].get("finish_reason") is not None


def sidecar_config(replica: Replica, emulator: MetadataEmulator):
    ts = replica.ts
    return config_from_mapping({
        "model_name": MODEL, "management_url": ts.management_url,
        "key_file": str(ts.workdir / "key_file.json"), "metrics_url": ts.metrics_url + "/metrics",
        "clouds": "aws", "aws_metadata_url": emulator.url, "poll_interval_s": 0.1,
        "listen_host": "127.0.0.1", "listen_port": 0, "drain_flag_file": str(replica.flag),
        "drain_margin_s": 2, "stop_reserve_s": 15, "quiet_s": 0.5,
        "quiet_polls": 2, "stop_method": "pid", "torchserve_pid_file": str(replica.pid_file)})


def ready_status(port: int) -> int:
    return requests.get(f"http://127.0.0.1:{port}/ready", timeout=5).status_code


def wait_for(condition, timeout_s: float, what: str) -> None:
    pause = threading.Event()
    for _ in range(int(timeout_s / 0.05)):
        if condition():
            return
        pause.wait(0.05)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def test_spot_notice_drains_streams_refuses_new_work_and_stops_torchserve(
        replica: Replica, emulator: MetadataEmulator) -> None:
    ts = replica.ts
    reports: list[DrainReport | None] = []
    with Sidecar(sidecar_config(replica, emulator)) as sidecar:
        port = sidecar.http.port
        assert ready_status(port) == 200, "a READY worker and no notice: ready"

        streams = [Stream() for _ in range(STREAMS)]
        for stream in streams:
            threading.Thread(target=stream.run, args=(ts,), daemon=True).start()
        for stream in streams:
            assert stream.accepted.wait(60) and stream.status == 200, stream.error

        emulator.raise_spot_interruption(in_seconds=90)
        drain = threading.Thread(target=lambda: reports.append(sidecar.run()), daemon=True)
        drain.start()
        wait_for(lambda: ready_status(port) == 503, 5, "/ready to turn 503 after the notice")
        wait_for(replica.flag.exists, 5, "the drain to close admission")

        late = requests.post(f"{ts.inference_url}/predictions/{MODEL}", headers=ts.headers(),
                             json={"prompt": "hello", "max_new_tokens": 8}, timeout=30)
        drain.join(timeout=90)
        assert not drain.is_alive(), "the drain finished within its budget"

    assert late.status_code == 503 and "draining" in late.json()["error"]["message"]
    for stream in streams:
        assert stream.finished.wait(10)
        assert stream.complete, (stream.status, stream.error, stream.lines[-1:])
        assert len(stream.lines) >= STREAM_TOKENS // 2  # whole streams, not cut short

    (report,) = reports
    assert report is not None and report.errors == [], report.errors if report else None
    assert report.in_flight_at_notice is not None and report.in_flight_at_notice >= 1
    closed = report.step("close_admission")
    assert closed is not None and closed.ok
    # At least one stream was still generating once admission was closed, and finished.
    assert any(s.last_line_epoch > closed.started_epoch for s in streams)
    assert report.in_flight_at_stop == 0 and report.stopped
    assert ts.process is not None and ts.process.wait(timeout=30) == 0, "TorchServe exited cleanly"
