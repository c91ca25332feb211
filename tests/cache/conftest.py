from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from handler.cache.key import CacheKey, sha256_json
from handler.cache.metrics import CacheMetrics
from handler.cache.s3 import S3Store, make_s3_client
from handler.testing.moto import CLEARED_AWS_ENV, FAKE_AWS_ENV, REGION, start_moto_server
from tests.support.artifacts import write_artifact


@pytest.fixture(scope="session")
def moto_server() -> Iterator[str]:
    """Endpoint URL of a moto S3 server on loopback, shared by the session."""
    with pytest.MonkeyPatch.context() as mp:
        for name, value in FAKE_AWS_ENV.items():
            mp.setenv(name, value)
        for name in CLEARED_AWS_ENV:
            mp.delenv(name, raising=False)
        server = start_moto_server()
        try:
            yield server.endpoint_url
        finally:
            server.stop()


@pytest.fixture
def s3_client(moto_server: str) -> Any:
    # One attempt and short timeouts: a test of a broken store must fail fast, not retry.
    return make_s3_client(moto_server, REGION, connect_timeout=2, read_timeout=5, max_attempts=1)


@pytest.fixture
def bucket(s3_client: Any) -> str:
    name = f"cache-{uuid.uuid4().hex[:12]}"  # a fresh bucket per test: no state leaks between tests
    s3_client.create_bucket(Bucket=name)
    return name


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def metrics(registry: CollectorRegistry) -> CacheMetrics:
    return CacheMetrics.create(registry)


@pytest.fixture
def s3_store(bucket: str, s3_client: Any, metrics: CacheMetrics) -> S3Store:
    return S3Store(bucket, "artifacts", s3_client, metrics=metrics, progress=False)


@pytest.fixture
def make_key() -> Callable[..., CacheKey]:
    """A key built without touching torch; override any field."""

    def make(**overrides: Any) -> CacheKey:
        fields: dict[str, Any] = dict(
            torch_version="2.13.0+cpu", triton_version="none", device_type="cpu",
            device_capability="x86_64 AVX512", weights_digest="ab" * 32,
            config_digest=sha256_json({"max_batch": 4}), package_version="0.1.0")
        return CacheKey(**{**fields, **overrides})

    return make


@pytest.fixture
def key(make_key: Callable[..., CacheKey]) -> CacheKey:
    return make_key()


@pytest.fixture
def artifact(tmp_path: Path) -> Path:
    return write_artifact(tmp_path / "src")

