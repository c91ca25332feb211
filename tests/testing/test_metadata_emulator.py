"""The emulator itself must behave like the real metadata services, or the watcher tests
prove nothing."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import time

import pytest
import requests

from handler.testing.metadata_emulator import MetadataEmulator

TTL = "X-aws-ec2-metadata-token-ttl-seconds"
TOKEN = "X-aws-ec2-metadata-token"
ACTION = "/latest/meta-data/spot/instance-action"

# A hung long-poll or server must fail, not stall CI (as every sidecar test, see its conftest).
pytestmark = pytest.mark.timeout(30)


def token(url: str, ttl: str = "60") -> requests.Response:
    return requests.put(url + "/latest/api/token", headers={TTL: ttl}, timeout=2)


def test_token_ttl_must_be_1_to_21600(emulator: MetadataEmulator) -> None:
    assert token(emulator.url, "0").status_code == 400
    assert token(emulator.url, "21601").status_code == 400
    assert token(emulator.url, "abc").status_code == 400
    assert requests.put(emulator.url + "/latest/api/token", timeout=2).status_code == 400
    assert token(emulator.url, "21600").status_code == 200


def test_token_put_refused_through_a_proxy_or_on_a_versioned_path(
        emulator: MetadataEmulator) -> None:
    proxied = requests.put(emulator.url + "/latest/api/token",
                           headers={TTL: "60", "X-Forwarded-For": "10.0.0.1"}, timeout=2)
    versioned = requests.put(emulator.url + "/2021-03-23/api/token", headers={TTL: "60"},
                             timeout=2)
    assert (proxied.status_code, versioned.status_code) == (403, 403)


def test_get_without_or_with_unknown_token_is_401(emulator: MetadataEmulator) -> None:
    assert requests.get(emulator.url + ACTION, timeout=2).status_code == 401
    unknown = requests.get(emulator.url + ACTION, headers={TOKEN: "nope"}, timeout=2)
    assert unknown.status_code == 401


def test_expired_token_is_401(emulator_with_clock) -> None:
    emulator, clock = emulator_with_clock
    issued = token(emulator.url, "5").text
    clock.advance(5.0)
    assert requests.get(emulator.url + ACTION, headers={TOKEN: issued},
                        timeout=2).status_code == 401


def test_instance_action_404_until_raised_then_aws_shape(emulator: MetadataEmulator) -> None:
    headers = {TOKEN: token(emulator.url).text}
    assert requests.get(emulator.url + ACTION, headers=headers, timeout=2).status_code == 404
    emulator.raise_spot_interruption("stop", in_seconds=30)
    response = requests.get(emulator.url + ACTION, headers=headers, timeout=2)
    body = json.loads(response.text)
    assert response.status_code == 200 and set(body) == {"action", "time"}
    assert body["action"] == "stop" and body["time"].endswith("Z")
    assert int(response.headers[TTL]) <= 60


def test_gcp_requires_metadata_flavor(emulator: MetadataEmulator) -> None:
    url = emulator.url + "/computeMetadata/v1/instance/preempted"
    assert requests.get(url, timeout=2).status_code == 403
    answer = requests.get(url, headers={"Metadata-Flavor": "Google"}, timeout=2)
    assert (answer.status_code, answer.text, answer.headers["Metadata-Flavor"]) == \
        (200, "FALSE", "Google")


def test_gcp_long_poll_returns_unchanged_value_at_timeout(emulator: MetadataEmulator) -> None:
    url = emulator.url + "/computeMetadata/v1/instance/preempted"
    first = requests.get(url, headers={"Metadata-Flavor": "Google"}, timeout=2)
    started = time.monotonic()
    answer = requests.get(url, headers={"Metadata-Flavor": "Google"}, timeout=5,
                          params={"wait_for_change": "true", "timeout_sec": "0.3",
                                  "last_etag": first.headers["ETag"]})
    assert answer.text == "FALSE" and 0.25 < time.monotonic() - started < 3


def test_azure_requires_metadata_header_and_api_version(emulator: MetadataEmulator) -> None:
    url = emulator.url + "/metadata/scheduledevents"
    assert requests.get(url, params={"api-version": "2020-07-01"}, timeout=2).status_code == 400
    assert requests.get(url, headers={"Metadata": "true"}, timeout=2).status_code == 400
    answer = requests.get(url, headers={"Metadata": "true"},
                          params={"api-version": "2020-07-01"}, timeout=2)
    assert answer.json() == {"DocumentIncarnation": 1, "Events": []}


def test_azure_malformed_acknowledgement_is_400(emulator: MetadataEmulator) -> None:
    answer = requests.post(emulator.url + "/metadata/scheduledevents",
                           headers={"Metadata": "true"}, params={"api-version": "2020-07-01"},
                           json={"StartRequests": [{"Id": "x"}]}, timeout=2)
    assert answer.status_code == 400 and emulator.state.acks == []


def test_fault_injection_answers_500_for_the_next_k_requests(emulator: MetadataEmulator) -> None:
    emulator.inject_fault(2, status=500)
    codes = [token(emulator.url).status_code for _ in range(3)]
    assert codes == [500, 500, 200]


def test_http_control_raises_a_spot_interruption(emulator: MetadataEmulator) -> None:
    answer = requests.post(emulator.url + "/_control/spot",
                           json={"action": "terminate", "in_seconds": 30}, timeout=2)
    assert answer.status_code == 200
    assert emulator.state.spot_action()["action"] == "terminate"
    unknown = requests.post(emulator.url + "/_control/nope", json={}, timeout=2)
    assert unknown.status_code == 404 and "spot" in unknown.json()["known"]


def test_cli_serves_until_sigterm() -> None:
    """The chaos run starts the emulator as its own process and reads the URL from stdout."""
    proc = subprocess.Popen([sys.executable, "-m", "handler.testing.metadata_emulator", "--port", "0"],
                            stdout=subprocess.PIPE, text=True)
    try:
        url = json.loads(proc.stdout.readline())["url"]
        requests.post(url + "/_control/gcp_preempt", json={}, timeout=2).raise_for_status()
        assert requests.get(url + "/_control/state", timeout=2).json()["gcp_preempted"] is True
        proc.terminate()
        assert proc.wait(timeout=10) == 0
    finally:
        proc.kill()
        proc.wait()


def test_stop_releases_a_pending_long_poll(emulator: MetadataEmulator) -> None:
    url = emulator.url + "/computeMetadata/v1/instance/preempted"
    etag = requests.get(url, headers={"Metadata-Flavor": "Google"}, timeout=2).headers["ETag"]
    done = threading.Event()

    def long_poll() -> None:
        # The server going away mid-request is an acceptable outcome here.
        with contextlib.suppress(requests.RequestException):
            requests.get(url, headers={"Metadata-Flavor": "Google"}, timeout=10,
                         params={"wait_for_change": "true", "last_etag": etag})
        done.set()

    threading.Thread(target=long_poll, daemon=True).start()
    time.sleep(0.2)  # let the request reach the server; there is no event to wait on here
    emulator.stop()
    assert done.wait(5)
