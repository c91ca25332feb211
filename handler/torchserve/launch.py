"""Start and stop a real TorchServe process, and wait until a model's worker is READY.

Used by `serve.sh`, the end-to-end tests and the benchmarks. TorchServe's `/ping` says Healthy
while a worker is still loading, so readiness here is "a worker of the model reports READY" on the
management API, as KServe's wrapper checks it.
"""
from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import requests

from handler.engine import platform
from handler.engine.compiled.warm_start import LOADED, SWITCHED
from handler.torchserve.client import KeyFile, TorchServeClient
from handler.torchserve.errors import TorchServeError
from handler.torchserve.stop import stop_with_cli, terminate_tree
from handler.worker_log import MODEL_LOG, first_cause

log = logging.getLogger(__name__)

PORT_KEYS = ("inference_address", "management_address", "metrics_address", "grpc_inference_port", "grpc_management_port")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class Ports:
    inference: int = 8080
    management: int = 8081
    metrics: int = 8082
    grpc_inference: int = 7070
    grpc_management: int = 7071
    worker_base: int = 9000

    @classmethod
    def free(cls) -> Ports:
        return cls(*(free_port() for _ in range(6)))


def read_properties(path: Path) -> dict[str, str]:
    props = {}
    for line in Path(path).read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            props[key.strip()] = value.strip()
    return props


def write_properties(props: dict[str, str], path: Path) -> None:
    Path(path).write_text("".join(f"{k}={v}\n" for k, v in props.items()))


def with_ports(props: dict[str, str], ports: Ports) -> dict[str, str]:
    out = dict(props)
    out["inference_address"] = f"http://127.0.0.1:{ports.inference}"
    out["management_address"] = f"http://127.0.0.1:{ports.management}"
    out["metrics_address"] = f"http://127.0.0.1:{ports.metrics}"
    out["grpc_inference_address"] = "127.0.0.1"
    out["grpc_management_address"] = "127.0.0.1"
    out["grpc_inference_port"] = str(ports.grpc_inference)
    out["grpc_management_port"] = str(ports.grpc_management)
    # Workers talk to the frontend over /tmp/.ts.sock.<port> whatever TMPDIR says, from 9000 up:
    # a private range keeps instances on one machine apart.
    out["initial_worker_port"] = str(ports.worker_base)
    return out


# A worker's death as the frontend logs it (its own last words, "Backend worker process died.",
# are lost when the frontend stops reading its stdout first: on a loaded machine most of them were)
LOAD_FAILED = "Load model failed: {model}, error: Worker died."
TS_LOG = Path("logs") / "ts_log.log"
CRASH_LOOP = 3  # worker deaths before READY that mean its load will not succeed


@dataclass
class TorchServe:
    workdir: Path
    ports: Ports
    process: subprocess.Popen | None = None
    keys: KeyFile | None = None
    model_log_offset: int = 0  # where this run's part of a reused logs/model_log.log starts
    ts_log_offset: int = 0  # and of logs/ts_log.log

    @property
    def inference_url(self) -> str:
        return f"http://127.0.0.1:{self.ports.inference}"

    @property
    def management_url(self) -> str:
        return f"http://127.0.0.1:{self.ports.management}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.ports.metrics}"

    @property
    def key_file(self) -> Path:
        return self.workdir / "key_file.json"  # the JVM writes it into its working directory

    def token(self, api: str = "inference") -> str | None:
        """The key for `api` ("inference" or "management"); None until TorchServe wrote its key file."""
        if self.keys is None:
            try:
                self.keys = KeyFile.load(self.key_file)
            except TorchServeError:  # half-written
                return None
        if self.keys is None:
            return None
        return self.keys.inference_key if api == "inference" else self.keys.management_key

    def headers(self, api: str = "inference") -> dict[str, str]:
        token = self.token(api)
        return {"Authorization": f"Bearer {token}"} if token else {}

    def client(self, model: str) -> TorchServeClient:
        """The management API for `model` (renews the management key when it expires)."""
        return TorchServeClient(self.management_url, model, key_file=self.key_file, timeout_s=10.0)

    def ready_workers(self, model: str) -> int:
        try:
            return self.client(model).describe().ready_workers
        except TorchServeError:
            return 0

    def wait_ready(self, model: str, timeout: float) -> float:
        """Block until a worker of `model` is READY; returns seconds waited."""
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            if self.process is not None and self.process.poll() is not None:
                raise TorchServeError(f"TorchServe exited; see {self.workdir / 'logs'}")
            if self.ready_workers(model):
                return time.monotonic() - start
            deaths, last_error = self.worker_deaths(model)
            if deaths >= CRASH_LOOP:  # TorchServe would restart it for ever, with backoff
                raise TorchServeError(f"model {model!r}: its worker died {deaths} times while loading; first error: "
                                      f"{last_error or 'none logged'}; see {self.workdir / MODEL_LOG}")
            time.sleep(0.2)
        raise TorchServeError(f"model {model!r} not READY after {timeout:.0f} s; see {self.workdir / 'logs'}")

    def wait_compiled(self, model: str, deadline: float, prompt: str = "Hi", interval: float = 5.0) -> None:
        """Block until `model`'s worker serves compiled steps (time.monotonic() `deadline`). A
        worker that loads or compiles them in the background serves eager steps and switches at a step, so
        steps are driven with a 1-token request every `interval` seconds meanwhile, as traffic
        would (more often would take the CPU a compile in the background needs), and at once when the
        worker says they are loaded: then any request would be served compiled."""
        while SWITCHED not in self.model_log():
            if time.monotonic() > deadline:
                raise TorchServeError(f"model {model!r}: the worker never switched to compiled steps; see {self.workdir / MODEL_LOG}")
            self.wait_ready(model, timeout=60)  # it must stay up meanwhile
            requests.post(f"{self.inference_url}/predictions/{model}", json={"prompt": prompt, "max_new_tokens": 1},
                          headers=self.headers(), timeout=600).raise_for_status()
            until = time.monotonic() + interval
            while time.monotonic() < until and LOADED not in self.model_log():
                time.sleep(0.25)

    def model_log(self) -> str:
        """What the workers logged since this TorchServe started (a restart appends to the file)."""
        return _read_from(self.workdir / MODEL_LOG, self.model_log_offset)

    def worker_deaths(self, model: str) -> tuple[int, str | None]:
        """How often a worker of `model` died since this TorchServe started (the frontend's count),
        and the first real cause the workers logged."""
        died = LOAD_FAILED.format(model=model)
        deaths = sum(died in ln for ln in _read_from(self.workdir / TS_LOG, self.ts_log_offset).splitlines())
        return deaths, first_cause(self.model_log().splitlines())

    def stop(self, timeout: float = 60) -> None:
        """`torchserve --stop`, then the tree this launcher started is made sure gone (a
        TorchServeError if some of it had to be killed)."""
        try:
            stop_with_cli(timeout, str(Path(sys.executable).parent / "torchserve"), cwd=self.workdir, env=_env(self.workdir))
        except (TorchServeError, subprocess.TimeoutExpired) as err:  # e.g. it was not running
            log.warning("torchserve --stop: %s", err)
        process = self.process
        if process is not None:
            terminate_tree(process.pid, timeout, wait_root=lambda t: _waited(process, t))


def _read_from(path: Path, offset: int) -> str:
    """A log's text from `offset` on ("" before it exists)."""
    if not path.exists():
        return ""
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read().decode(errors="replace")


def _waited(process: subprocess.Popen, timeout: float) -> bool:
    try:
        process.wait(timeout=timeout)
        return True
    except subprocess.TimeoutExpired:
        return False


def _env(workdir: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = platform.child_environment()
    # TorchServe starts workers with the `python` on PATH: make it this environment's.
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    # TorchServe keeps its pid file in the temp dir: a private one lets instances coexist.
    (workdir / "tmp").mkdir(parents=True, exist_ok=True)
    env["TMPDIR"] = str(workdir / "tmp")
    env["LOG_LOCATION"] = str(workdir / "logs")
    env["METRICS_LOCATION"] = str(workdir / "logs")
    env.update(extra or {})
    return env


def start_torchserve(model_store: Path, models: dict[str, str], ts_config: Path, workdir: Path, ports: Ports | None = None,
                     extra_props: dict[str, str] | None = None, env: dict[str, str] | None = None) -> TorchServe:
    """Start TorchServe in the background with its own copy of `ts_config` (ports replaced when
    `ports` is given). Returns at once; call `wait_ready`."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    props = read_properties(ts_config)
    if ports is not None:
        props = with_ports(props, ports)
    props.update(extra_props or {})
    props = with_paths_from(props, Path(ts_config).parent)
    config = workdir / "config.properties"
    write_properties(props, config)
    cmd = [str(Path(sys.executable).parent / "torchserve"), "--start", "--ncs", "--foreground",
           "--model-store", str(Path(model_store).resolve()), "--ts-config", str(config),
           "--models", *(f"{name}={mar}" for name, mar in models.items())]
    offsets = {log: (workdir / log).stat().st_size if (workdir / log).exists() else 0 for log in (MODEL_LOG, TS_LOG)}
    # The JVM writes key_file.json and ts.pid into its working directory.
    with open(workdir / "torchserve.out", "ab") as log:  # the child keeps its own descriptor
        process = subprocess.Popen(cmd, cwd=workdir, env=_env(workdir, env), stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    ts = TorchServe(workdir, ports or ports_from(props), process, model_log_offset=offsets[MODEL_LOG],
                    ts_log_offset=offsets[TS_LOG])
    _wait_for_key_file(ts, props)
    return ts


LOG_CONFIG_ARG = "-Dlog4j.configurationFile="


def with_paths_from(props: dict[str, str], base: Path) -> dict[str, str]:
    """`props` with the files they name (metrics_config, vmargs' log configuration) relative to
    `base`, the config file's directory, made absolute: TorchServe runs in its own workdir here."""
    props = dict(props)
    if "metrics_config" in props:
        props["metrics_config"] = str((base / props["metrics_config"]).resolve())
    if "vmargs" in props:
        props["vmargs"] = " ".join(_log_config_from(arg, base) for arg in props["vmargs"].split())
    return props


def _log_config_from(arg: str, base: Path) -> str:
    value = arg.removeprefix(LOG_CONFIG_ARG)
    if value == arg or "://" in value:  # another JVM argument, or a URI (file:///...)
        return arg
    return LOG_CONFIG_ARG + str((base / value).resolve())


def ports_from(props: dict[str, str]) -> Ports:
    def port(key: str, default: int) -> int:
        value = props.get(key)
        return int(value.rsplit(":", 1)[1]) if value and ":" in value.split("//")[-1] else int(value) if value else default

    return Ports(port("inference_address", 8080), port("management_address", 8081), port("metrics_address", 8082),
                 port("grpc_inference_port", 7070), port("grpc_management_port", 7071))


def _wait_for_key_file(ts: TorchServe, props: dict[str, str], timeout: float = 60) -> None:
    if props.get("disable_token_authorization", "false").lower() == "true":
        return
    assert ts.process is not None, "launch started it"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ts.token("management"):
            return
        if ts.process.poll() is not None:
            raise TorchServeError(f"TorchServe exited with {ts.process.returncode}; see {ts.workdir / 'torchserve.out'}")
        time.sleep(0.1)
    raise TorchServeError(f"TorchServe wrote no key_file.json within {timeout} s; see {ts.workdir / 'torchserve.out'}")
