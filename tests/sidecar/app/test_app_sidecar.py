"""The whole `watch` loop: emulator notice -> /ready 503 -> ELB, ASG, wait, publish, stop."""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import boto3
import pytest
import requests

from handler.sidecar.app.sidecar import Hooks, Sidecar
from handler.sidecar.config import config_from_mapping
from handler.sidecar.drain.stop_record import record_stop_seconds
from handler.testing.metadata_emulator import MetadataEmulator
from tests.support.fake_torchserve import FakeManagement

from ..conftest import cache_key, install_artifact


def settings(emulator: MetadataEmulator, management: FakeManagement, **extra: Any):
    return config_from_mapping({
        "clouds": "aws", "aws_metadata_url": emulator.url, "azure_metadata_url": emulator.url,
        "management_url": management.url, "metrics_url": management.metrics_url,
        "listen_host": "127.0.0.1", "listen_port": 0,
        "poll_interval_s": 0.05, "http_timeout_s": 1.0, "stop_method": "none",
        "drain_margin_s": 1, "stop_reserve_s": 1, "quiet_s": 0.1, **extra})


class Probe:
    """Hooks that record what the drain did, and what /ready said while it did it."""

    def __init__(self) -> None:
        self.ready_during_drain: list[int] = []
        self.published_by: list[float] = []
        self.stopped_with: list[float] = []
        self.port = 0

    def in_flight(self) -> int:
        answer = requests.get(f"http://127.0.0.1:{self.port}/ready", timeout=2)
        self.ready_during_drain.append(answer.status_code)
        return 0

    def hooks(self) -> Hooks:
        return Hooks(in_flight=self.in_flight,
                     publish_cache=lambda by: self.published_by.append(by) or True,
                     stop_torchserve=self.stopped_with.append)


def test_spot_interruption_drains_end_to_end(emulator: MetadataEmulator,
                                             management: FakeManagement, moto: str) -> None:
    ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=moto)
    elbv2 = boto3.client("elbv2", region_name="us-east-1", endpoint_url=moto)
    autoscaling = boto3.client("autoscaling", region_name="us-east-1", endpoint_url=moto)
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    group = elbv2.create_target_group(Name="llm", Protocol="HTTP", Port=8080, VpcId=vpc,
                                      TargetType="instance")["TargetGroups"][0]["TargetGroupArn"]
    instance = emulator.state.instance_id  # the sidecar reads it from IMDS
    elbv2.register_targets(TargetGroupArn=group, Targets=[{"Id": instance, "Port": 8080}])
    autoscaling.create_launch_configuration(LaunchConfigurationName="od", ImageId="ami-12c6146b",
                                            InstanceType="g5.xlarge")
    autoscaling.create_auto_scaling_group(AutoScalingGroupName="od", LaunchConfigurationName="od",
                                          MinSize=0, MaxSize=3, DesiredCapacity=0,
                                          AvailabilityZones=["us-east-1a"])
    config = settings(emulator, management, elb_target_group_arn=group, elb_target_port=8080,
                      asg_name="od", aws_region="us-east-1", aws_endpoint_url=moto)
    probe = Probe()
    with Sidecar(config, probe.hooks()) as sidecar:
        probe.port = sidecar.http.port
        assert requests.get(f"http://127.0.0.1:{probe.port}/ready", timeout=2).status_code == 200
        requests.post(emulator.url + "/_control/spot", json={"in_seconds": 30},
                      timeout=2).raise_for_status()
        report = sidecar.run()
        metrics = requests.get(f"http://127.0.0.1:{probe.port}/metrics", timeout=2).text
    assert report.exit_code == 0 and report.errors == []
    assert [s.name for s in report.steps] == ["not_ready", "deregister", "request_capacity",
                                              "wait_in_flight", "publish", "stop"]
    assert probe.ready_during_drain and set(probe.ready_during_drain) == {503}
    assert report.published is True and probe.stopped_with
    assert elbv2.describe_target_health(TargetGroupArn=group)["TargetHealthDescriptions"] == []
    groups = autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=["od"])
    assert groups["AutoScalingGroups"][0]["DesiredCapacity"] == 1
    assert 'ts_llm_sidecar_notices_total{kind="spot_interruption"} 1.0' in metrics
    assert "ts_llm_sidecar_drain_duration_seconds_count 1.0" in metrics


def test_azure_preempt_is_acknowledged_after_the_drain(emulator: MetadataEmulator,
                                                       management: FakeManagement) -> None:
    probe = Probe()
    with Sidecar(settings(emulator, management, clouds="azure"), probe.hooks()) as sidecar:
        probe.port = sidecar.http.port
        event_id = emulator.raise_azure_event("Preempt", in_seconds=30)
        report = sidecar.run()
    assert report.steps[-1].name == "acknowledge" and report.steps[-1].ok
    assert emulator.state.acks == [event_id]


def test_real_sigterm_to_this_process_runs_the_drain(emulator: MetadataEmulator,
                                                     management: FakeManagement) -> None:
    probe = Probe()
    with Sidecar(settings(emulator, management, signal_grace_s=20), probe.hooks()) as sidecar:
        probe.port = sidecar.http.port
        assert signal.getsignal(signal.SIGTERM) == sidecar.signals.handle  # else this kills pytest
        os.kill(os.getpid(), signal.SIGTERM)
        report = sidecar.run()
    assert report.notice.kind.value == "signal" and report.exit_code == 0
    assert 15 < report.plan.budget_s <= 20
    assert signal.getsignal(signal.SIGTERM) != sidecar.signals.handle  # restored on close


def test_rebalance_alone_does_not_drain(emulator: MetadataEmulator,
                                        management: FakeManagement, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="handler.sidecar")
    until = threading.Event()
    with Sidecar(settings(emulator, management), Probe().hooks()) as sidecar:
        sidecar.board.add_listener(lambda notice: until.set())
        emulator.raise_rebalance()
        assert sidecar.run(until=until) is None
        assert [n.kind.value for n in sidecar.board.advisories()] == ["rebalance"]
        ready = requests.get(f"http://127.0.0.1:{sidecar.http.port}/ready", timeout=2)
    assert ready.status_code == 200
    # the runbook's drain words are kept for notices that drain
    assert "advisory notice, not draining" in caplog.text and "termination notice" not in caplog.text



def test_configured_cache_is_published_during_the_drain(
        emulator: MetadataEmulator, management: FakeManagement, tmp_path: Path) -> None:
    cache = pytest.importorskip("handler.cache")
    management.statuses = ["LOADING"]  # never ready: only the drain publishes
    key = install_artifact(tmp_path / "compiled", key_file=False)
    (tmp_path / "key.json").write_text(json.dumps(key.describe()))
    store = tmp_path / "store"
    config = settings(emulator, management, cache_store=str(store),
                      cache_key=str(tmp_path / "key.json"), cache_dir=str(tmp_path / "compiled"))
    with Sidecar(config, Hooks(stop_torchserve=lambda timeout_s: None)) as sidecar:
        emulator.raise_spot_interruption(in_seconds=30)
        report = sidecar.run()
        after_start = sidecar.registry.get_sample_value(
            "ts_llm_sidecar_publishes_after_start_total", {"outcome": "published"})
    assert report.published is True and report.errors == []
    assert cache.LocalStore(store).exists(key)
    assert after_start is None


def test_a_measured_stop_sets_the_next_drains_stop_reserve(
        emulator: MetadataEmulator, management: FakeManagement, tmp_path: Path) -> None:
    record = tmp_path / "state" / "stop-seconds.json"
    config = settings(emulator, management, stop_record_file=str(record), stop_reserve_s=30)
    with Sidecar(config, Hooks(stop_torchserve=lambda timeout_s: time.sleep(0.2))) as sidecar:
        assert sidecar.drain_policy().stop_reserve_s == 30  # nothing measured yet: the configured one
        emulator.raise_spot_interruption(in_seconds=60)
        report = sidecar.run()
    assert report.plan.policy.stop_reserve_s == 30
    recorded = json.loads(record.read_text())["stop_seconds"]
    assert len(recorded) == 1 and recorded[0] >= 0.2
    with Sidecar(config, Hooks(stop_torchserve=lambda timeout_s: None)) as again:
        # max(0.2 s + 1 s, the 2 s floor): from the measurement, not the configured 30 s
        assert again.drain_policy().stop_reserve_s == pytest.approx(2.0)


# ---- the publish after start


def wait_for(predicate, timeout_s: float = 10.0) -> None:
    done = threading.Event()
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        done.wait(0.02)


def after_start(sidecar: Sidecar, outcome: str) -> float | None:
    return sidecar.registry.get_sample_value("ts_llm_sidecar_publishes_after_start_total",
                                             {"outcome": outcome})


def after_start_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "handler.sidecar.publish_after_start"]


def test_cold_start_artifact_is_published_once_torchserve_is_ready(
        emulator: MetadataEmulator, management: FakeManagement, tmp_path: Path,
        caplog) -> None:
    cache = pytest.importorskip("handler.cache")
    management.statuses = ["LOADING"]  # compiling cold
    cache_dir, store = tmp_path / "cache" / "aot", cache.LocalStore(tmp_path / "store")
    cache_dir.parent.mkdir()
    config = settings(emulator, management, cache_store=str(tmp_path / "store"),
                      cache_dir=str(cache_dir))
    with caplog.at_level(logging.INFO), \
            Sidecar(config, Hooks(stop_torchserve=lambda timeout_s: None)) as sidecar:
        key = install_artifact(cache_dir)  # the worker installs it, then turns READY
        threading.Event().wait(0.3)
        assert not store.exists(key), "nothing is published before TorchServe is ready"
        management.statuses = ["READY"]
        wait_for(lambda: after_start(sidecar, "published") == 1)
        assert store.exists(key)
        lines = after_start_lines(caplog)
        # The drain still publishes; the store already has it.
        emulator.raise_spot_interruption(in_seconds=30)
        report = sidecar.run()
    assert len(lines) == 1 and lines[0].startswith(f"compile cache: published {key.digest()}")
    assert report.errors == [] and report.published is False
    # The publish runs beside the wait: the wait gets everything up to the stop reserve.
    assert report.plan.wait_until == report.plan.publish_by
    assert sidecar.registry.get_sample_value("ts_llm_sidecar_uploads_total",
                                             {"outcome": "unchanged"}) == 1
    assert len(after_start_lines(caplog)) == 1, "published once"


@pytest.mark.parametrize("layout, outcome", [
    ("restored", "already_present"),  # a warm start: the store has it
    ("key_only", "no_artifact"),  # the worker loaded the .mar's artifact; the key step's file
    ("empty", "no_key"),
])
def test_publish_after_start_outcomes(emulator: MetadataEmulator, management: FakeManagement,
                                      tmp_path: Path, caplog, layout: str,
                                      outcome: str) -> None:
    cache = pytest.importorskip("handler.cache")
    cache_dir, store = tmp_path / "aot", cache.LocalStore(tmp_path / "store")
    if layout == "restored":
        store.publish(install_artifact(cache_dir), cache_dir)
    elif layout == "key_only":
        cache_dir.mkdir()
        (cache_dir / "cache-key.json").write_text(json.dumps(cache_key().describe()))
    config = settings(emulator, management, cache_store=str(tmp_path / "store"),
                      cache_dir=str(cache_dir))
    with caplog.at_level(logging.INFO), Sidecar(config) as sidecar:
        wait_for(lambda: after_start(sidecar, outcome) == 1)
    assert len(after_start_lines(caplog)) == 1, after_start_lines(caplog)
    assert not any(r.levelno >= logging.WARNING for r in caplog.records
                   if r.name == "handler.sidecar.publish_after_start")


def test_publish_after_start_can_be_turned_off(emulator: MetadataEmulator,
                                               management: FakeManagement,
                                               tmp_path: Path) -> None:
    cache = pytest.importorskip("handler.cache")
    key = install_artifact(tmp_path / "aot")
    config = settings(emulator, management, cache_store=str(tmp_path / "store"),
                      cache_dir=str(tmp_path / "aot"), publish_after_start=False)
    with Sidecar(config, Hooks(stop_torchserve=lambda timeout_s: None)) as sidecar:
        assert "publish-after-start" not in [t.name for t in sidecar._threads]
        threading.Event().wait(0.3)  # TorchServe is READY all along
        assert not cache.LocalStore(tmp_path / "store").exists(key)
        emulator.raise_spot_interruption(in_seconds=30)
        report = sidecar.run()
    assert report.published is True  # only the drain publishes


def test_publish_after_start_counts_a_refused_artifact_as_an_error(
        emulator: MetadataEmulator, management: FakeManagement, tmp_path: Path,
        caplog) -> None:
    pytest.importorskip("handler.cache")
    cache_dir = tmp_path / "aot"
    install_artifact(cache_dir)
    (cache_dir / "stray.txt").write_text("x")
    config = settings(emulator, management, cache_store=str(tmp_path / "store"),
                      cache_dir=str(cache_dir))
    with caplog.at_level(logging.INFO), Sidecar(config) as sidecar:
        wait_for(lambda: after_start(sidecar, "error") == 1)
    (line,) = after_start_lines(caplog)
    assert "not published after start: ArtifactDirError" in line and "stray.txt" in line
    assert not (tmp_path / "store").exists()


def test_no_publish_after_start_once_a_notice_is_pending(
        emulator: MetadataEmulator, management: FakeManagement, tmp_path: Path) -> None:
    pytest.importorskip("handler.cache")
    management.statuses = ["LOADING"]
    install_artifact(tmp_path / "aot")
    config = settings(emulator, management, cache_store=str(tmp_path / "store"),
                      cache_dir=str(tmp_path / "aot"))
    with Sidecar(config, Hooks(stop_torchserve=lambda timeout_s: None)) as sidecar:
        emulator.raise_spot_interruption(in_seconds=30)
        report = sidecar.run()  # the drain publishes
        management.statuses = ["READY"]
        threading.Event().wait(0.3)
        outcomes = [s.labels["outcome"] for m in sidecar.registry.collect()
                    if m.name == "ts_llm_sidecar_publishes_after_start" for s in m.samples
                    if s.name.endswith("_total")]
    assert report.published is True and outcomes == []


# ---- the restore step's record, and the drain budget at start


def test_restore_rejections_are_exported_on_the_sidecar_metrics(
        emulator: MetadataEmulator, management: FakeManagement, tmp_path: Path) -> None:
    cache = pytest.importorskip("handler.cache")
    from handler.cache.key import sha256_file
    from handler.cache.store import blob_name
    from handler.sidecar.app.cli import main

    src, dest = tmp_path / "compiled", tmp_path / "cache" / "aot"
    key = install_artifact(src)
    cache.LocalStore(tmp_path / "store").publish(key, src)
    blob = tmp_path / "store" / blob_name(key.digest(), sha256_file(src / "a.bin"))
    blob.write_bytes(b"tamper" * 100)  # same size, other bytes
    assert main(["restore", "--cache-store", str(tmp_path / "store"), "--cache-dir", str(dest),
                 "--cache-key", str(src / "cache-key.json")]) == 0
    config = settings(emulator, management, cache_store=str(tmp_path / "store"),
                      cache_dir=str(dest))
    with Sidecar(config) as sidecar:
        text = requests.get(f"http://127.0.0.1:{sidecar.http.port}/metrics", timeout=2).text
    assert "ts_llm_cache_artifacts_rejected_total 1.0" in text
    assert "ts_llm_cache_artifact_downloads_total 0.0" in text
    assert 'ts_llm_sidecar_cache_restores_total{outcome="rejected"} 1.0' in text


def test_no_restore_record_exports_no_restore(emulator: MetadataEmulator,
                                              management: FakeManagement,
                                              tmp_path: Path) -> None:
    pytest.importorskip("handler.cache")
    config = settings(emulator, management, cache_store=str(tmp_path / "store"),
                      cache_dir=str(tmp_path / "aot"))
    with Sidecar(config) as sidecar:
        text = requests.get(f"http://127.0.0.1:{sidecar.http.port}/metrics", timeout=2).text
    assert "ts_llm_sidecar_cache_restores_total{" not in text
    assert "ts_llm_cache_artifacts_rejected_total 0.0" in text


def budget_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and "drain budget too small" in r.getMessage()]


def test_defaults_with_a_cache_store_fit_a_30_s_budget_and_warn_below_it(
        emulator: MetadataEmulator, management: FakeManagement, tmp_path: Path,
        caplog) -> None:
    """Issue 41 item 5: a 30 s grace with a cache store left 4 s (margin 1 + stop 10 + publish
    15) and warned. The publish runs beside the wait now: 19 s, no warning; 15 s still warns."""
    pytest.importorskip("handler.cache")
    values = {
        "clouds": "aws,gcp", "aws_metadata_url": emulator.url,
        "gcp_metadata_url": emulator.url, "management_url": management.url,
        "listen_host": "127.0.0.1", "listen_port": 0, "stop_method": "none",
        "cache_store": str(tmp_path / "store"), "cache_dir": str(tmp_path / "aot")}
    with caplog.at_level(logging.WARNING), Sidecar(config_from_mapping(values)):
        pass
    assert budget_lines(caplog) == []
    caplog.clear()
    with caplog.at_level(logging.WARNING), \
            Sidecar(config_from_mapping({**values, "signal_grace_s": 15, "gcp_notice_s": 15})):
        pass
    lines = budget_lines(caplog)
    # SIGTERM / drain request and GCP; AWS's 120 s fits.
    assert len(lines) == 2, lines
    signal_line = next(line for line in lines if "SIGTERM" in line)
    for text in ("a 15 s SIGTERM or drain request notice leaves 4 s",
                 "drain_margin_s=1 + stop_reserve_s=10 (< min_wait_s=5)",
                 "raise signal_grace_s (--signal-grace-s)", "drain_margin_s (--drain-margin-s)",
                 "stop_reserve_s (--stop-reserve-s"):
        assert text in signal_line, signal_line
    assert "publish" not in signal_line
    assert any("raise gcp_notice_s (--gcp-notice-s)" in line for line in lines)


def test_the_budget_warning_takes_the_measured_stop(emulator: MetadataEmulator, management: FakeManagement,
                                                    tmp_path: Path, caplog) -> None:
    """Issue 62: an 8 s grace warned "leaves 0 s" with the default 10 s reserve while the drain
    took a measured one; now the warning counts what the drain will reserve (2.5 s + 1 s)."""
    record = tmp_path / "stop-seconds.json"
    record_stop_seconds(record, 2.5)
    config = settings(emulator, management, stop_reserve_s=10, signal_grace_s=8, stop_record_file=str(record))
    with caplog.at_level(logging.WARNING), Sidecar(config):
        pass
    (line,) = budget_lines(caplog)
    assert "a 8 s SIGTERM or drain request notice leaves 3.5 s" in line and "stop_reserve_s=3.5" in line, line


def test_the_pod_settings_fit_the_budget(emulator: MetadataEmulator,
                                         management: FakeManagement, tmp_path: Path,
                                         caplog) -> None:
    pytest.importorskip("handler.cache")
    config = config_from_mapping({
        "aws_metadata_url": emulator.url, "management_url": management.url,
        "listen_host": "127.0.0.1", "listen_port": 0, "stop_method": "none",
        "signal_grace_s": 120, "drain_margin_s": 5,
        "cache_store": str(tmp_path / "store"), "cache_dir": str(tmp_path / "aot")})
    with caplog.at_level(logging.WARNING), Sidecar(config):
        pass
    assert budget_lines(caplog) == []


def test_drain_closes_admission_with_the_flag_file_and_writes_the_report(
        emulator: MetadataEmulator, management: FakeManagement, tmp_path: Path) -> None:
    flag, report_file = tmp_path / "run" / "draining", tmp_path / "drain-report.json"
    flag.parent.mkdir()
    flag.write_text("left by an earlier drain\n")
    seen_at_notice: list[bool] = []
    probe = Probe()
    hooks = Hooks(in_flight=lambda: seen_at_notice.append(flag.exists()) or 0,
                  stop_torchserve=probe.stopped_with.append)
    config = settings(emulator, management, drain_flag_file=str(flag),
                      report_file=str(report_file))
    with Sidecar(config, hooks) as sidecar:
        assert not flag.exists(), "a fresh sidecar opens admission"
        emulator.raise_spot_interruption(in_seconds=30)
        report = sidecar.run()
    assert [s.name for s in report.steps][:3] == ["not_ready", "close_admission",
                                                   "wait_in_flight"]
    # Read once before closing (in flight at the notice), then only with the flag in place.
    assert seen_at_notice[0] is False and all(seen_at_notice[1:]) and len(seen_at_notice) > 1
    assert flag.exists() and report.errors == []
    written = json.loads(report_file.read_text())
    assert written["event"] == "drain_report" and written["exit_code"] == 0


def test_sidecar_metrics_carry_the_hpa_queue_metric(emulator: MetadataEmulator,
                                                    management: FakeManagement) -> None:
    management.pending, management.running = 3, [2]
    with Sidecar(settings(emulator, management)) as sidecar:
        text = requests.get(f"http://127.0.0.1:{sidecar.http.port}/metrics", timeout=2).text
    assert 'ts_llm_requests_waiting{model_name="llm"} 3.0' in text
    assert 'ts_llm_requests_in_flight{model_name="llm"} 5.0' in text
