"""HAProxy in front of the chaos run's replicas: installed if missing (Debian package, needs
root; never by CI), configured on loopback, its per-server state read from the stats CSV.

The configuration is what an operator would deploy in front of this package:

- health: each server is checked on its sidecar's `/ready` (200 only when a worker is READY
  and no drain has begun), not on TorchServe's port;
- retries: only what provably never ran: a failed connection, and the 503 the drain flag
  answers before admission (`retry-on conn-failure 503`, redispatched to another server);
  never a timeout or a broken response, which may have run. HAProxy can only resend a request
  it still holds whole: `option http-buffer-request` waits for the body before forwarding (else
  a 503 that comes after the body was streamed through is passed to the client);
- balance: least connections (requests last seconds, not milliseconds).

A second frontend (`pinned`, the same servers, checks and retries) sends every request to the
first server while it is up (`balance first`): the chaos run's way to put a request on the replica
about to be noticed, as a balancer's pick may, and still let HAProxy retry it elsewhere. Its
requests are non-streaming, whose bytes all come at their end: its `timeout server` is the longest
generation's (WHOLE_ANSWER_S), not a stream's idle 120 s (a first run's 600-token answers, retried
onto the loaded survivor, took longer than that and were answered 504).
"""

from __future__ import annotations

import csv
import io
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import requests

from bench.chaos.replica import stop_process
from handler.torchserve.launch import free_port


@dataclass(frozen=True)
class Backend:
    name: str
    port: int  # TorchServe's inference port
    check_port: int  # the sidecar's port (/ready)


WHOLE_ANSWER_S = 900
CONFIG = """\
global
    maxconn 2048
    log stdout format raw local0 info

defaults
    mode http
    log global
    option httplog
    timeout connect 2s
    timeout client 120s
    timeout server 120s
    timeout queue 30s
    retries 3
    option redispatch 1
    retry-on conn-failure 503
    option http-buffer-request

frontend llm
    bind 127.0.0.1:{port}
    default_backend replicas

backend replicas
    balance leastconn
    option httpchk GET /ready
    http-check expect status 200
    default-server inter {check_ms}ms fall 1 rise 2
{servers}

frontend pinned
    bind 127.0.0.1:{pinned_port}
    default_backend first_up

backend first_up
    balance first
    timeout server {whole_answer_s}s
    option httpchk GET /ready
    http-check expect status 200
    default-server inter {check_ms}ms fall 1 rise 2
{servers}

listen stats
    bind 127.0.0.1:{stats_port}
    stats enable
    stats uri /stats
"""


def ensure_installed() -> str:
    """The haproxy binary; installs the Debian package when it is missing (root only)."""
    found = shutil.which("haproxy")
    if found:
        return found
    if shutil.which("apt-get") is None:
        raise RuntimeError("haproxy is not installed and there is no apt-get: install HAProxy >= 2.0")
    print("chaos: installing haproxy (apt-get)", flush=True)
    for cmd in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", "haproxy"]):
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    found = shutil.which("haproxy")
    if not found:
        raise RuntimeError("apt-get installed haproxy but it is not on PATH")
    return found


class HAProxy:
    def __init__(self, binary: str, backends: list[Backend], work: Path, check_ms: int = 1000) -> None:
        self.port, self.pinned_port, self.stats_port = free_port(), free_port(), free_port()
        work.mkdir(parents=True, exist_ok=True)
        self.config_path = work / "haproxy.cfg"
        self.log_path = work / "haproxy.log"
        servers = "\n".join(f"    server {b.name} 127.0.0.1:{b.port} check port {b.check_port}"
                            for b in backends)
        self.config_path.write_text(CONFIG.format(port=self.port, pinned_port=self.pinned_port, stats_port=self.stats_port,
                                                  whole_answer_s=WHOLE_ANSWER_S,
                                                  check_ms=check_ms, servers=servers))
        first_line = subprocess.run([binary, "-v"], capture_output=True, text=True, check=True).stdout.split()
        self.version = " ".join(first_line[:3])  # "HAProxy version 2.6.12-1+deb12u3"
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen([binary, "-db", "-f", str(self.config_path)],
                                            stdout=log, stderr=subprocess.STDOUT)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pinned_url(self) -> str:
        """The first server while it is up (`balance first`), with the same retries."""
        return f"http://127.0.0.1:{self.pinned_port}"

    def servers(self, backend: str = "replicas") -> dict[str, dict[str, str]]:
        """The stats CSV's row per server of `backend` (status, stot, wretr, wredis...)."""
        text = requests.get(f"http://127.0.0.1:{self.stats_port}/stats;csv", timeout=2).text
        rows = csv.DictReader(io.StringIO(text.lstrip("# ")))
        return {r["svname"]: r for r in rows if r["pxname"] == backend and r["svname"] != "BACKEND"}

    def wait_up(self, names: list[str], timeout_s: float = 30.0) -> None:
        give_up = time.monotonic() + timeout_s
        while time.monotonic() < give_up:
            if self.process.poll() is not None:
                raise RuntimeError(f"haproxy exited with {self.process.returncode}; see {self.log_path}")
            try:
                if all(self.servers(backend).get(n, {}).get("status") == "UP"
                       for n in names for backend in ("replicas", "first_up")):
                    return
            except requests.RequestException:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"HAProxy did not see {names} UP within {timeout_s} s; see {self.log_path}")

    def stop(self) -> None:
        stop_process(self.process, timeout_s=10)
