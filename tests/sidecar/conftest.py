"""Fixtures for the sidecar tests: the real metadata emulator, a fake TorchServe management
API (real HTTP, real 0.12 JSON shapes), moto in server mode, and a fake clock.

Everything listens on 127.0.0.1 with a free port; nothing leaves the machine.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from handler.testing.metadata_emulator import MetadataEmulator
from handler.testing.moto import start_moto_server
from tests.support.fake_torchserve import START, FakeManagement


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Every sidecar test is bounded: a hung long-poll or server must fail, not stall CI.
    # A test that sets its own bound (the end-to-end one) keeps it.
    for item in items:
        in_sidecar = "tests/sidecar/" in str(item.fspath).replace("\\", "/")
        if in_sidecar and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(30))


class FakeClock:
    """time.time stand-in; `sleep` advances it instead of waiting."""

    def __init__(self, now: float = START) -> None:
        self.now = now
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def emulator() -> Iterator[MetadataEmulator]:
    with MetadataEmulator() as emu:
        yield emu


@pytest.fixture
def emulator_with_clock(clock: FakeClock) -> Iterator[tuple[MetadataEmulator, FakeClock]]:
    """An emulator whose token expiry runs on the fake clock."""
    with MetadataEmulator(clock=clock) as emu:
        yield emu, clock


# ---- fake TorchServe management API


@pytest.fixture
def management() -> Iterator[FakeManagement]:
    fake = FakeManagement()
    yield fake
    fake.close()


# ---- moto in server mode


@pytest.fixture(scope="session")
def moto_url() -> Iterator[str]:
    with pytest.MonkeyPatch.context() as env:
        # Fake credentials, and no credential or region lookups that could leave the machine.
        env.setenv("AWS_ACCESS_KEY_ID", "testing")
        env.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        env.setenv("AWS_SESSION_TOKEN", "testing")
        env.setenv("AWS_DEFAULT_REGION", "us-east-1")
        env.setenv("AWS_EC2_METADATA_DISABLED", "true")
        env.delenv("AWS_PROFILE", raising=False)
        server = start_moto_server()
        yield server.endpoint_url
        server.stop()


@pytest.fixture
def moto(moto_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """A moto server with empty state, and fake credentials in the environment."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    requests.post(f"{moto_url}/moto-api/reset", timeout=5).raise_for_status()
    return moto_url


# ---- compile cache directories, as a restore or a worker's install leaves them


def cache_key(**change: str):
    cache = pytest.importorskip("handler.cache")
    fields = dict(torch_version="2.13.0", triton_version="none", device_type="cpu",
                  device_capability="x86_64", weights_digest="w" * 16, config_digest="c" * 16,
                  package_version="0.1.0")
    return cache.CacheKey(**{**fields, **change})


def install_artifact(cache_dir: Path, key=None, key_file: bool = True) -> object:
    """An installed artifact: files, the key file inside it (listed, as the worker writes it),
    and the manifest (handler.engine.compiled.artifacts.install's layout). Returns the key."""
    from handler.cache.manifest import MANIFEST_NAME, build_manifest

    key = key if key is not None else cache_key()
    (cache_dir / "sub").mkdir(parents=True)
    if key_file:
        (cache_dir / "cache-key.json").write_text(json.dumps(key.describe()))
    (cache_dir / "a.bin").write_bytes(b"kernel" * 100)
    (cache_dir / "sub" / "b.json").write_text('{"graph": 1}')
    (cache_dir / MANIFEST_NAME).write_bytes(build_manifest(cache_dir, key.describe()).to_json())
    return key
