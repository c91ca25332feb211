"""A real S3 API on loopback: moto's threaded server, started in-process, for the tests and
the benchmarks that need a compile-cache store (bench/startup.py, the chaos run). moto comes
with the test extras; the product never imports this module.

    server = start_moto_server()
    client = boto3.client("s3", endpoint_url=server.endpoint_url, region_name=REGION)
    ...
    server.stop()

Credentials are fake (FAKE_AWS_ENV); moto accepts any unless auth is enforced.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from moto.server import ThreadedMotoServer

REGION = "us-east-1"
FAKE_AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": REGION,
    "AWS_EC2_METADATA_DISABLED": "true",  # never probe an instance role from a test
    "NO_PROXY": "127.0.0.1,localhost",  # loopback must not go through a proxy
}
# Unset so a developer's real profile or session can never reach a test.
CLEARED_AWS_ENV = ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_ENDPOINT_URL")


@dataclass
class MotoServer:
    endpoint_url: str
    _server: ThreadedMotoServer

    def stop(self) -> None:
        self._server.stop()


def start_moto_server() -> MotoServer:
    """Start moto on 127.0.0.1 and a free port; returns once it accepts connections."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    return MotoServer(f"http://{host}:{port}", server)


def _post(url: str, data: bytes) -> None:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    # Not form-encoded (urllib's default): Flask would parse the body away from request.data.
    request = urllib.request.Request(url, data=data, method="POST",
                                     headers={"Content-Type": "application/octet-stream"})
    with opener.open(request, timeout=5) as r:
        assert r.status == 200, (url, r.status)


@contextmanager
def enforced_auth(endpoint_url: str) -> Iterator[None]:
    """Make the server check credentials against its (empty) IAM, so every key is refused.

    Moto authenticates nothing by default; INITIAL_NO_AUTH_ACTION_COUNT=0 through its
    reset-auth endpoint turns checking on for every request, and "inf" turns it off again.
    """
    _post(f"{endpoint_url}/moto-api/reset-auth", b"0")
    try:
        yield
    finally:
        _post(f"{endpoint_url}/moto-api/reset-auth", b"inf")
