"""`ts-llm-sidecar drain [--wait]`: ask the running sidecar to drain, optionally until done.

The preStop hook of the TorchServe container: the kubelet runs it before it sends SIGTERM and
waits for it, so with --wait SIGTERM reaches TorchServe only once the sidecar has let every
accepted request finish. It talks to the sidecar on 127.0.0.1:<listen_port>.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import requests

from handler.sidecar.drain.control import DONE
from handler.sidecar.errors import SidecarError

USER_AGENT = "ts-llm-sidecar-drain"


class DrainClientError(SidecarError):
    pass


def request_drain(port: int, *, wait: bool, timeout_s: float | None = None,
                  poll_s: float = 0.5, host: str = "127.0.0.1",
                  session: requests.Session | None = None,
                  clock: Callable[[], float] = time.monotonic,
                  sleep: Callable[[float], None] = time.sleep) -> dict[str, Any]:
    """POST /drain, then (with `wait`) poll GET /drain until the drain is done.
    Returns the last status document; raises DrainClientError with what to check."""
    http = session or requests.Session()
    url = f"http://{host}:{port}/drain"
    status = _call(http, "POST", url)
    give_up = None if timeout_s is None else clock() + timeout_s
    while wait and status["state"] != DONE:
        if give_up is not None and clock() >= give_up:
            raise DrainClientError(f"drain not done after {timeout_s} s (state "
                                   f"{status['state']}); see the sidecar's log")
        sleep(poll_s)
        status = _call(http, "GET", url)
    return status


def exit_code(status: dict[str, Any]) -> int:
    """0 once the drain is done and stopped cleanly (or still running without --wait)."""
    report = status.get("report")
    if status["state"] != DONE or report is None:
        return 0
    return int(report["exit_code"])


def _call(http: requests.Session, method: str, url: str) -> dict[str, Any]:
    try:
        response = http.request(method, url, timeout=5, headers={"User-Agent": USER_AGENT})
    except requests.ConnectionError as err:
        raise DrainClientError(f"no sidecar answering at {url}: is `ts-llm-sidecar watch` "
                               "running in this pod with the same --listen-port?") from err
    except requests.RequestException as err:
        raise DrainClientError(f"{method} {url}: {type(err).__name__}") from err
    if response.status_code not in (200, 202):
        raise DrainClientError(f"{method} {url}: HTTP {response.status_code} "
                               f"{response.text[:200]}")
    status: dict[str, Any] = response.json()
    return status
