"""The fleet's stop record beside the cache: read at start, written after a drain."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from handler.cache import LocalStore
from handler.cache.signing import ManifestSigner, ManifestVerifier, Signing
from handler.sidecar.app import fleet_stop
from handler.sidecar.app.sidecar import Hooks, Sidecar
from handler.sidecar.config import config_from_mapping
from handler.sidecar.drain.stop_record import read_stop_seconds, record_stop_seconds
from handler.testing.metadata_emulator import MetadataEmulator
from tests.support.fake_torchserve import FakeManagement


def store_at(root: Path, signing: Signing | None = None) -> LocalStore:
    return LocalStore(root, progress=False, signing=signing)


def test_the_record_is_one_object_beside_the_artifacts(tmp_path: Path) -> None:
    store = store_at(tmp_path / "store")
    fleet_stop.write_fleet(store, [2.5, 2.6])
    assert (tmp_path / "store" / "fleet" / "stop-seconds.json").is_file()
    assert fleet_stop.read_fleet(store) == [2.5, 2.6]


def test_a_replica_without_a_record_starts_from_the_fleets(tmp_path: Path) -> None:
    store, local = store_at(tmp_path / "store"), tmp_path / "replica" / "stop-seconds.json"
    assert fleet_stop.seed(store, local, timeout_s=5) == []  # nothing anywhere: the default
    fleet_stop.write_fleet(store, [2.5])
    assert fleet_stop.seed(store, local, timeout_s=5) == [2.5]
    assert read_stop_seconds(local) == [2.5]  # what the next drain here reads


def test_a_replicas_own_record_wins_over_the_fleets(tmp_path: Path) -> None:
    store, local = store_at(tmp_path / "store"), tmp_path / "stop-seconds.json"
    fleet_stop.write_fleet(store, [9.0])
    record_stop_seconds(local, 2.4)
    assert fleet_stop.seed(store, local, timeout_s=5) == [2.4]


@pytest.mark.parametrize("stored", [b'{"stop_seconds": [250, 400]}', b'{"stop_seconds": ["import os"]}',
                                    b"not json", b'{"stop_seconds": [-1]}'])
def test_a_fleet_record_out_of_range_is_ignored(tmp_path: Path, stored: bytes, caplog) -> None:
    root, local = tmp_path / "store", tmp_path / "stop-seconds.json"
    (root / "fleet").mkdir(parents=True)
    (root / "fleet" / "stop-seconds.json").write_bytes(stored)
    assert fleet_stop.seed(store_at(root), local, timeout_s=5) == []
    assert not local.exists() and "failed" in caplog.text


def test_with_the_fleet_keys_the_record_is_signed_and_an_unsigned_one_refused(tmp_path: Path, caplog) -> None:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    private = Ed25519PrivateKey.generate()
    signing = Signing(ManifestSigner(private), ManifestVerifier(private.public_key()))
    root, local = tmp_path / "store", tmp_path / "stop-seconds.json"
    fleet_stop.write_fleet(store_at(root, signing), [2.5])
    assert fleet_stop.read_fleet(store_at(root, signing)) == [2.5]
    assert fleet_stop.read_fleet(store_at(root)) == [2.5]  # no verifier: the body, unchecked
    fleet_stop.write_fleet(store_at(root), [0.5])  # a bucket writer without the key
    assert fleet_stop.seed(store_at(root, signing), local, timeout_s=5) == []
    assert "refused" in caplog.text and not local.exists()


def test_share_writes_only_a_new_measurement(tmp_path: Path) -> None:
    store, local = store_at(tmp_path / "store"), tmp_path / "stop-seconds.json"
    fleet_stop.write_fleet(store, [3.0])
    seen = fleet_stop.seed(store, local, timeout_s=5)
    assert not fleet_stop.share(store, local, seen, timeout_s=5)  # nothing measured here
    record_stop_seconds(local, 2.5)
    assert fleet_stop.share(store, local, seen, timeout_s=5)
    assert fleet_stop.read_fleet(store) == [3.0, 2.5]


def test_a_hung_store_is_given_up_within_the_bound(tmp_path: Path) -> None:
    release = threading.Event()

    class Hung:
        signing = Signing()

        def read_record(self, name: str) -> bytes | None:
            release.wait(10)
            return None

        def describe(self) -> str:
            return "hung store"

    start = time.monotonic()
    hung: Any = Hung()
    assert fleet_stop.seed(hung, tmp_path / "stop-seconds.json", timeout_s=0.2) == []
    release.set()
    assert time.monotonic() - start < 2


# ---- the sidecar: read at start, written after the drain


def settings(emulator: MetadataEmulator, management: FakeManagement, tmp_path: Path,
             replica: str, **extra: Any):
    cache_dir = tmp_path / replica / "aot"
    return config_from_mapping({
        "clouds": "aws", "aws_metadata_url": emulator.url, "management_url": management.url,
        "metrics_url": management.metrics_url, "listen_host": "127.0.0.1", "listen_port": 0,
        "poll_interval_s": 0.05, "http_timeout_s": 1.0, "drain_margin_s": 1, "quiet_s": 0.1,
        "publish_after_start": False, "cache_store": str(tmp_path / "store"),
        "cache_dir": str(cache_dir), **extra})


def wait_for(predicate, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_a_new_replicas_first_drain_keeps_the_fleets_measured_stop(
        emulator: MetadataEmulator, management: FakeManagement, tmp_path: Path) -> None:
    """Replica a stops TorchServe itself (the VM entrypoint), measures 0.3 s and shares it;
    replica b, new, with no record of its own, plans its first drain from it."""
    first = settings(emulator, management, tmp_path, "a", stop_method="none")
    with Sidecar(first, Hooks(stop_torchserve=lambda timeout_s: time.sleep(0.3))) as sidecar:
        emulator.raise_spot_interruption(in_seconds=30)
        sidecar.run()
    shared = fleet_stop.read_fleet(store_at(tmp_path / "store"))
    assert len(shared) == 1 and 0.3 <= shared[0] < 1
    second = settings(emulator, management, tmp_path, "b", stop_method="none")
    with Sidecar(second) as fresh:
        wait_for(lambda: read_stop_seconds(tmp_path / "b" / "stop-seconds.json") == shared)
        assert fresh.drain_policy().stop_reserve_s == pytest.approx(2.0)  # not the 10 s default


def test_in_a_pod_the_stop_the_entrypoint_measured_is_shared_at_sigterm(
        emulator: MetadataEmulator, management: FakeManagement, tmp_path: Path) -> None:
    """stop_method none: the sidecar drains (preStop) and lingers; TorchServe's entrypoint,
    stopped by the kubelet, records its stop on the shared volume; the sidecar's own SIGTERM
    (after TorchServe exited) ends the linger, and it shares that record with the fleet."""
    config = settings(emulator, management, tmp_path, "pod", stop_method="none")
    shared_record = tmp_path / "pod" / "stop-seconds.json"  # the entrypoint's --stop-record-file
    until = threading.Event()
    with Sidecar(config) as sidecar:
        emulator.raise_spot_interruption(in_seconds=30)

        def kubelet() -> None:
            wait_for(lambda: sidecar.control.done.is_set())
            assert not shared_record.exists(), "the sidecar stopped nothing, so measured nothing"
            record_stop_seconds(shared_record, 2.6)  # the entrypoint's drain
            until.set()  # the sidecar's SIGTERM

        threading.Thread(target=kubelet, daemon=True).start()
        report = sidecar.run(until=until)
    assert report is not None and report.exit_code == 0
    assert fleet_stop.read_fleet(store_at(tmp_path / "store")) == [2.6]
