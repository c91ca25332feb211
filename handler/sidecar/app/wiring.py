"""From the config to the running pieces: the watchers, and each drain step's dependency.

Everything here is decided once, at start: a missing setting leaves its step out of the drain
(DrainDeps.optional_steps), and a bad one fails before any notice can arrive.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from botocore.exceptions import BotoCoreError, ClientError

from handler.cache import ArtifactStore, CacheMetrics
from handler.cache.errors import SigningKeyError
from handler.cache.signing import Signing
from handler.sidecar.app import cache_sync
from handler.sidecar.app.signing_keys import load_signing, may_publish
from handler.sidecar.config import Cloud, SidecarConfig, StopMethod
from handler.sidecar.drain import admission, capacity
from handler.sidecar.drain.report import DrainReport
from handler.sidecar.drain.stop_record import NAME as STOP_RECORD_NAME
from handler.sidecar.errors import CapacityError, ConfigError, SidecarError
from handler.sidecar.notice.azure import AzureWatcher
from handler.sidecar.notice.gcp import GcpWatcher
from handler.sidecar.notice.imds import ImdsWatcher
from handler.sidecar.notice.termination import Clock, TerminationNotice
from handler.sidecar.notice.watcher import Watcher
from handler.torchserve.client import running_reader
from handler.torchserve.listeners import close_listeners
from handler.torchserve.stop import read_pid_file, stop_pid, stop_with_cli
from handler.worker_log import first_cause_in

log = logging.getLogger(__name__)

# AWS announces a spot interruption two minutes ahead (imds.py reads the exact time).
AWS_NOTICE_S = 120.0


def build_watchers(config: SidecarConfig, clock: Clock) -> list[Watcher]:
    timeout = config.http_timeout_s
    makers: dict[Cloud, Callable[[], Watcher]] = {
        Cloud.AWS: lambda: ImdsWatcher(config.aws_metadata_url, clock=clock, timeout_s=timeout,
                                       token_ttl_s=config.imds_token_ttl_s),
        Cloud.GCP: lambda: GcpWatcher(config.gcp_metadata_url, clock=clock, timeout_s=timeout,
                                      wait_timeout_s=config.gcp_wait_timeout_s,
                                      notice_s=config.gcp_notice_s),
        Cloud.AZURE: lambda: AzureWatcher(config.azure_metadata_url, clock=clock,
                                          timeout_s=timeout,
                                          min_notice_s=config.azure_min_notice_s),
    }
    return [makers[cloud]() for cloud in dict.fromkeys(config.clouds)]


def notice_lengths(config: SidecarConfig) -> list[tuple[float, str, str | None]]:
    """(seconds of notice, what gives it, the setting that sets it or None when the cloud fixes
    it) for every notice this sidecar can get: a signal or drain request, and each cloud's."""
    notices: list[tuple[float, str, str | None]] = [
        (config.signal_grace_s, "SIGTERM or drain request", "signal_grace_s")]
    clouds = set(config.clouds)
    if Cloud.AWS in clouds:
        notices.append((AWS_NOTICE_S, "AWS spot", None))
    if Cloud.GCP in clouds:
        notices.append((config.gcp_notice_s, "GCP preemption", "gcp_notice_s"))
    if Cloud.AZURE in clouds:
        notices.append((config.azure_min_notice_s, "Azure event (without NotBefore)",
                        "azure_min_notice_s"))
    return notices


# ---- drain steps


def config_publisher(config: SidecarConfig,
                     metrics: CacheMetrics | None = None) -> cache_sync.Publisher | None:
    key_path = config.cache_key_path
    if not (config.cache_store and config.cache_dir and key_path):
        return None
    signing = load_signing(config)
    if not may_publish(signing):
        return None
    return cache_sync.Publisher(config.cache_store, key_path, Path(config.cache_dir),
                                config.aws_endpoint_url, config.aws_region, metrics, signing)


def fleet_store(config: SidecarConfig, publisher: object) -> ArtifactStore | None:
    """Where the fleet's stop record is kept: the publisher's store, else (a pod that may not
    publish, or a hooked publisher) the configured one; None without a cache store."""
    if isinstance(publisher, cache_sync.Publisher):
        return publisher.store
    if not config.cache_store:
        return None
    try:  # the keys were read (and warned about) once already, by config_publisher
        signing = Signing.from_files(config.cache_signing_key, config.cache_public_key)
    except SigningKeyError as err:
        raise ConfigError(str(err)) from err
    return cache_sync.open_store(config.cache_store, config.aws_endpoint_url, config.aws_region,
                                 signing=signing)


def config_running(config: SidecarConfig) -> Callable[[], int] | None:
    if not config.metrics_url:
        return None
    return running_reader(config.metrics_url, config.running_metric, config.model_name,
                          timeout_s=config.http_timeout_s)


def config_closer(config: SidecarConfig, clock: Clock) -> Callable[[], None] | None:
    if not config.drain_flag_file:
        return None
    return admission.flag_closer(Path(config.drain_flag_file), clock)


def config_cutter(config: SidecarConfig, clock: Clock) -> Callable[[], None] | None:
    if not config.drain_flag_file:
        return None
    return admission.flag_cutter(Path(config.drain_flag_file), clock)


def stopper(config: SidecarConfig) -> Callable[[float], None]:
    if config.stop_method is StopMethod.CLI:
        return stop_with_cli
    if (pid := pid_reader(config)) is not None:
        return lambda timeout_s: stop_pid(pid(), timeout_s)
    return lambda timeout_s: None  # the orchestrator stops TorchServe


def stop_record_path(config: SidecarConfig) -> Path | None:
    """stop_record_file, else stop-seconds.json beside cache_dir (a replica's lasting state);
    None without either."""
    if config.stop_record_file:
        return Path(config.stop_record_file)
    return Path(config.cache_dir).parent / STOP_RECORD_NAME if config.cache_dir else None


def pid_reader(config: SidecarConfig) -> Callable[[], int] | None:
    """TorchServe's pid, when this sidecar stops it by pid; None otherwise."""
    if config.stop_method is not StopMethod.PID:
        return None
    pid_file = Path(config.torchserve_pid_file or "")
    return lambda: read_pid_file(pid_file)


def listener_closer(config: SidecarConfig, root_pid: Callable[[], int] | None) -> Callable[[], list[int]] | None:
    """Shuts the listeners of TorchServe's process tree except the management and metrics ports
    (the drain still reads them); None when disabled or when TorchServe's pid is not known here."""
    if not config.close_listeners or root_pid is None:
        return None
    keep = [port for url in (config.management_url, config.metrics_url) if url and (port := urlsplit(url).port)]
    return lambda: close_listeners(root_pid(), keep)


def deregisterer(config: SidecarConfig, watchers: list[Watcher]) -> Callable[[], None] | None:
    if not config.elb_target_group_arn:
        return None
    target_id = config.elb_target_id or _instance_id(watchers)
    return functools.partial(capacity.deregister_target, aws_client(config, "elbv2"),
                             config.elb_target_group_arn, target_id, config.elb_target_port)


def capacity_requester(config: SidecarConfig, autoscaling: Any,
                       notice: TerminationNotice) -> Callable[[], None] | None:
    """ASG desired+1 and/or the webhook, whichever are configured; None when neither is."""
    calls: list[Callable[[], object]] = []
    if config.asg_name:
        calls.append(functools.partial(capacity.request_replacement, autoscaling,
                                       config.asg_name))
    if config.webhook_url:
        payload: dict[str, object] = {"event": "termination_notice",
                                      "notice": notice.to_json(),
                                      "model": config.model_name}
        calls.append(functools.partial(capacity.post_webhook, config.webhook_url,
                                       payload, config.http_timeout_s))
    return functools.partial(_call_all, calls) if calls else None


def acknowledger(config: SidecarConfig, watchers: list[Watcher], notice: TerminationNotice
                 ) -> Callable[[TerminationNotice], None] | None:
    azure = next((w for w in watchers if isinstance(w, AzureWatcher)), None)
    if notice.source != "azure" or azure is None or not config.azure_acknowledge:
        return None
    return lambda n: azure.acknowledge(n.detail["event_id"])


def aws_client(config: SidecarConfig, service: str) -> Any:
    import boto3  # only sidecars with ELB/ASG side effects pay for the import

    return boto3.client(service, region_name=config.aws_region,
                        endpoint_url=config.aws_endpoint_url)


def write_report(path: Path, report: DrainReport) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report.to_json(), default=str, indent=1) + "\n")
    except OSError as err:
        log.error("cannot write the drain report to %s: %s", path, err)


def worker_error(model_log: str | None) -> Callable[[], str | None] | None:
    return None if model_log is None else lambda: first_cause_in(Path(model_log))


def _instance_id(watchers: list[Watcher]) -> str:
    imds = next((w for w in watchers if isinstance(w, ImdsWatcher)), None)
    if imds is None:
        raise ConfigError("elb_target_group_arn without elb_target_id needs the aws watcher "
                          "(the instance id comes from IMDS)")
    return imds.instance_id()


def _call_all(calls: list[Callable[[], object]]) -> None:
    """Every call runs even when an earlier one fails (the webhook is the fallback for a
    group at MaxSize); the failures are raised together afterwards."""
    failures: list[str] = []
    for call in calls:
        try:
            call()
        except (SidecarError, BotoCoreError, ClientError) as err:
            failures.append(f"{type(err).__name__}: {err}")
    if failures:
        raise CapacityError("; ".join(failures))
