"""A metadata emulator for AWS IMDSv2, GCP and Azure, served over real HTTP on loopback.

    python -m handler.testing.metadata_emulator --port 0   # prints {"url": "http://127.0.0.1:N"}

A test double, for tests and the chaos drill only: nothing in the serving or spot path imports
handler.testing (tests/testing/test_testing_isolation.py checks).

Semantics follow the services, not a mock's convenience: IMDSv2 is v2-only (no token, an
unknown or an expired one -> 401; TTL outside 1..21600 -> 400; PUT with X-Forwarded-For ->
403), spot paths are 404 until an interruption is raised; GCP needs `Metadata-Flavor: Google`
(else 403) and long-polls with wait_for_change/last_etag/timeout_sec; Azure needs
`Metadata: true` and an api-version (else 400) and records acknowledgements.

Control, from Python (methods below) or another process (POST /_control/<name>, JSON body):
spot {action, in_seconds} | rebalance | gcp_preempt | azure_event {event_type, in_seconds} |
fault {count, status, delay_s} | revoke_tokens | reset; GET /_control/state.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from email.message import Message
from typing import Any
from urllib.parse import parse_qs, urlsplit

from handler.http_server import Handler, HttpServerThread
from handler.sidecar.notice.termination import Clock
from handler.testing.metadata_state import MetadataState

AWS_TTL = "X-aws-ec2-metadata-token-ttl-seconds"
AWS_TOKEN = "X-aws-ec2-metadata-token"
NOT_FOUND_HTML = "<html><body><h1>404 - Not Found</h1></body></html>"


class MetadataEmulator:
    def __init__(self, host: str = "127.0.0.1", port: int = 0, clock: Clock = time.time) -> None:
        self.state = MetadataState(clock)
        self._server = HttpServerThread(host, port, _handler_class(self.state),
                                        name="metadata-emulator")

    @property
    def url(self) -> str:
        return f"http://{self._server.host}:{self._server.port}"

    def start(self) -> MetadataEmulator:
        self._server.start()
        return self

    def stop(self) -> None:
        self.state.close()  # wakes long-polls first, so the server's shutdown does not wait
        self._server.stop()

    def __enter__(self) -> MetadataEmulator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- control API (the same operations as POST /_control/...)

    def raise_spot_interruption(self, action: str = "terminate",
                                in_seconds: float = 120.0) -> dict[str, str]:
        return self.state.raise_spot_interruption(action, in_seconds)

    def raise_rebalance(self) -> dict[str, str]:
        return self.state.raise_rebalance()

    def preempt_gcp(self) -> None:
        self.state.preempt_gcp()

    def raise_azure_event(self, event_type: str = "Preempt", in_seconds: float = 30.0) -> str:
        return self.state.raise_azure_event(event_type, in_seconds)

    def inject_fault(self, count: int, status: int | None = 500, delay_s: float = 0.0) -> None:
        self.state.inject_fault(count, status, delay_s)

    def revoke_tokens(self) -> None:
        self.state.revoke_tokens()


@dataclass(frozen=True)
class Request:
    method: str
    route: str
    query: dict[str, list[str]]
    headers: Message
    body: bytes

    def arg(self, name: str, default: str | None = None) -> str | None:
        return self.query.get(name, [default])[0]


@dataclass(frozen=True)
class Response:
    status: int
    body: str | dict[str, object] = ""
    content_type: str = "text/plain"  # real IMDS answers JSON documents as text/plain
    headers: dict[str, str] = field(default_factory=dict)


def _handler_class(state: MetadataState) -> type[Handler]:
    class MetadataHandler(Handler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            self._serve("GET")

        def do_PUT(self) -> None:
            self._serve("PUT")

        def do_POST(self) -> None:
            self._serve("POST")

        def _serve(self, method: str) -> None:
            parts = urlsplit(self.path)
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            request = Request(method, parts.path, parse_qs(parts.query), self.headers, body)
            response = respond(request, state)
            state.record(method, request.route, response.status)
            self._write(response)

        def _write(self, response: Response) -> None:
            body, content_type = response.body, response.content_type
            if not isinstance(body, str):
                body, content_type = json.dumps(body), "application/json"
            # The client may have timed out and left: there is no one to answer.
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                self.send_body(response.status, content_type, body.encode(), response.headers)

        def log_message(self, format: str, *args: object) -> None:
            pass  # watchers poll every few hundred ms; access logs would drown the test output

    return MetadataHandler


def respond(req: Request, state: MetadataState) -> Response:
    if req.route.startswith("/_control/"):
        return _control(req, state)
    fault = state.take_fault()
    if fault is not None:
        state.closing.wait(fault.delay_s)
        if fault.status is not None:
            return Response(fault.status, "fault injected\n")
    if req.route.startswith("/latest/") or req.route.endswith("/api/token"):
        return _aws_token(req, state) if req.method == "PUT" else _aws(req, state)
    if req.route.startswith("/computeMetadata/"):
        return _gcp(req, state)
    if req.route.startswith("/metadata/"):
        return _azure(req, state)
    return Response(404, NOT_FOUND_HTML, "text/html")


def _aws(req: Request, state: MetadataState) -> Response:
    if req.method != "GET":
        return Response(405)
    left = state.token_seconds_left(req.headers.get(AWS_TOKEN))
    if left is None:
        return Response(401)
    ttl = {AWS_TTL: str(int(left))}
    spot, rebalance = state.spot_action(), state.rebalance()
    if req.route == "/latest/meta-data/spot/instance-action" and spot:
        return Response(200, json.dumps(spot), headers=ttl)
    if req.route == "/latest/meta-data/spot/termination-time" and spot:
        return Response(200, spot["time"], headers=ttl)
    if req.route == "/latest/meta-data/events/recommendations/rebalance" and rebalance:
        return Response(200, json.dumps(rebalance), headers=ttl)
    if req.route == "/latest/meta-data/instance-id":
        return Response(200, state.instance_id, headers=ttl)
    return Response(404, NOT_FOUND_HTML, "text/html", ttl)


def _aws_token(req: Request, state: MetadataState) -> Response:
    # A versioned token path and anything that came through a proxy are refused by design.
    if req.route != "/latest/api/token" or req.headers.get("X-Forwarded-For"):
        return Response(403)
    try:
        ttl = int(req.headers.get(AWS_TTL, ""))
        token = state.issue_token(ttl)
    except ValueError:
        return Response(400)
    return Response(200, token, headers={AWS_TTL: str(ttl)})


def _gcp(req: Request, state: MetadataState) -> Response:
    if req.headers.get("Metadata-Flavor") != "Google" or req.headers.get("X-Forwarded-For"):
        return Response(403, "Missing Metadata-Flavor:Google header.\n")
    flavor = {"Metadata-Flavor": "Google"}
    if req.method != "GET":
        return Response(405, headers=flavor)
    if req.route == "/computeMetadata/v1/instance/preempted":
        if req.arg("wait_for_change") == "true":
            try:
                timeout_s = float(req.arg("timeout_sec", "60") or 60)
            except ValueError:
                return Response(400, "timeout_sec must be a number\n", headers=flavor)
            value, etag = state.wait_gcp_change(req.arg("last_etag"), timeout_s)
        else:
            value, etag = state.gcp_preempted()
        return Response(200, value, "application/text", {**flavor, "ETag": etag})
    if req.route == "/computeMetadata/v1/instance/id":
        return Response(200, "4520031799277581759", "application/text", flavor)
    return Response(404, NOT_FOUND_HTML, "text/html", flavor)


def _azure(req: Request, state: MetadataState) -> Response:
    if req.headers.get("Metadata") != "true":
        return Response(400, {"error": "Bad request. Required metadata header not specified"})
    if req.arg("api-version") is None:
        return Response(400, {"error": "Bad request. api-version was not specified"})
    if req.route != "/metadata/scheduledevents":
        return Response(404, {"error": "Not found"})
    if req.method == "GET":
        return Response(200, state.azure_document())
    try:
        starts = json.loads(req.body)["StartRequests"]
        event_ids = [str(start["EventId"]) for start in starts]
    except (ValueError, KeyError, TypeError):
        return Response(400, {"error": "Bad request. Malformed StartRequests"})
    state.acknowledge(event_ids)
    return Response(200)


def _control(req: Request, state: MetadataState) -> Response:
    name = req.route.removeprefix("/_control/")
    if req.method == "GET" and name == "state":
        return Response(200, state.snapshot())
    if req.method != "POST" or name not in _CONTROL:
        return Response(404, {"error": f"no control {req.method} {name}",
                              "known": sorted(_CONTROL)})
    try:
        args = json.loads(req.body or b"{}")
        return Response(200, {"ok": True, "result": _CONTROL[name](state, args)})
    except (ValueError, TypeError, AttributeError) as err:
        return Response(400, {"error": f"{type(err).__name__}: {err}"})


_CONTROL: dict[str, Callable[[MetadataState, dict[str, Any]], object]] = {
    "spot": lambda s, a: s.raise_spot_interruption(a.get("action", "terminate"),
                                                   float(a.get("in_seconds", 120))),
    "rebalance": lambda s, a: s.raise_rebalance(),
    "gcp_preempt": lambda s, a: s.preempt_gcp(),
    "azure_event": lambda s, a: s.raise_azure_event(a.get("event_type", "Preempt"),
                                                    float(a.get("in_seconds", 30))),
    "fault": lambda s, a: s.inject_fault(int(a.get("count", 1)), a.get("status", 500),
                                         float(a.get("delay_s", 0.0))),
    "revoke_tokens": lambda s, a: s.revoke_tokens(),
    "reset": lambda s, a: s.reset(),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Metadata emulator for AWS, GCP and Azure.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 = any free port")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _exit_cleanly)
    with MetadataEmulator(args.host, args.port) as emulator:
        print(json.dumps({"url": emulator.url}), flush=True)
        with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C: stop like SIGTERM
            threading.Event().wait()
    return 0


def _exit_cleanly(signum: int, frame: object) -> None:
    raise SystemExit(0)  # unwinds through the `with`, which stops the server


if __name__ == "__main__":
    sys.exit(main())
