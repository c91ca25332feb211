"""SidecarConfig: one frozen dataclass, parsed once from a YAML file and/or CLI flags.

YAML keys and flags share the field names (`drain_margin_s` <-> `--drain-margin-s`); flags win.
Every `ts-llm-sidecar` subcommand reads the same settings, so one file serves them all. Unknown
keys are rejected with the list of allowed ones, so a typo never silently keeps a default.
"""

from __future__ import annotations

import argparse
import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from handler import typed_config
from handler.cache.key import KEY_FILE_NAME
from handler.sidecar.drain.plan import DrainPolicy
from handler.sidecar.errors import ConfigError


class Cloud(enum.StrEnum):
    AWS = "aws"
    GCP = "gcp"
    AZURE = "azure"


class StopMethod(enum.StrEnum):
    CLI = "cli"  # `torchserve --stop` (same host / pid namespace)
    PID = "pid"  # SIGTERM the tree under the pid in torchserve_pid_file
    NONE = "none"  # leave it to the orchestrator (a sidecar container without shared pids)


def _f(default: object, help: str) -> Any:  # `help` mirrors argparse
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class SidecarConfig:
    # TorchServe
    model_name: str = _f("llm", "model whose workers decide readiness")
    management_url: str = _f("http://127.0.0.1:8081", "TorchServe management API")
    key_file: str | None = _f(None, "TorchServe key_file.json; unset when token auth is off")
    metrics_url: str | None = _f("http://127.0.0.1:8082/metrics",
                                 "TorchServe's Prometheus endpoint, where the handler's running "
                                 "gauge is read (empty: queue only)")
    running_metric: str = _f("ts_llm_requests_running",
                             "gauge at metrics_url summed over workers: requests generating")
    model_log: str | None = _f(None, "TorchServe's logs/model_log.log: /ready names the cause of a "
                               "worker that fails to load")
    # Watchers
    clouds: tuple[Cloud, ...] = _f((Cloud.AWS,), "metadata services to watch: aws,gcp,azure")
    aws_metadata_url: str = _f("http://169.254.169.254", "IMDS base URL")
    gcp_metadata_url: str = _f("http://metadata.google.internal", "GCP metadata base URL")
    azure_metadata_url: str = _f("http://169.254.169.254", "Azure IMDS base URL")
    poll_interval_s: float = _f(2.0, "seconds between metadata polls (NTH uses 2)")
    http_timeout_s: float = _f(2.0, "timeout of one metadata request")
    imds_token_ttl_s: int = _f(3600, "IMDSv2 token TTL, 1..21600")
    gcp_wait_timeout_s: int = _f(60, "GCP wait_for_change long-poll timeout_sec")
    gcp_notice_s: float = _f(30.0, "GCP preemption deadline after the notice")
    azure_min_notice_s: float = _f(30.0, "Azure deadline when NotBefore is empty")
    azure_acknowledge: bool = _f(True, "acknowledge Azure events once the drain is done")
    signal_grace_s: float = _f(30.0, "deadline after SIGTERM/SIGINT or a `drain` request "
                                     "(the pod's terminationGracePeriodSeconds)")
    drain_on_rebalance: bool = _f(False, "treat an AWS rebalance recommendation as a notice")
    # Drain
    drain_margin_s: float = _f(1.0, "finish the drain this long before the deadline")
    stop_reserve_s: float = _f(10.0, "time kept for stopping TorchServe until a stop was measured "
                                     "here (stop_record_file) or by the fleet (beside the cache)")
    min_wait_s: float = _f(5.0, "warn at start about a notice that leaves the in-flight wait "
                                "less than this")
    quiet_s: float = _f(1.0, "in-flight must read 0 this long before the wait ends")
    quiet_polls: int = _f(2, "...and on this many polls in a row (backend metrics lag)")
    drain_flag_file: str | None = _f(None, "created when the drain starts; the handler's "
                                           "drain_flag_file (same path): new requests get 503")
    stop_method: StopMethod = _f(StopMethod.CLI, "cli | pid | none (none: keep serving "  # noqa: RUF009 - _f returns a field
                                                 "/ready and /drain after the drain until SIGTERM)")
    torchserve_pid_file: str | None = _f(None, "pid file for stop_method=pid")
    close_listeners: bool = _f(True, "before stopping TorchServe (stop_method pid, or the "
                                     "entrypoint), shut its listeners but management and metrics "
                                     "from outside the JVM, so a late connect is refused, not "
                                     "accepted then reset; Linux, ptrace rights over the JVM")
    report_file: str | None = _f(None, "write the drain report here as JSON")
    stop_record_file: str | None = _f(None, "where drains record how long TorchServe took to stop "
                                            "(the next drain's stop reserve comes from it); "
                                            "default: stop-seconds.json beside cache_dir")
    # Compile cache: restored before TorchServe starts, published during the drain
    cache_store: str | None = _f(None, "artifact store URI: s3://bucket/prefix or a directory")
    cache_dir: str | None = _f(None, "local compile cache directory")
    cache_key: str | None = _f(None, "cache key JSON (CacheKey.describe()); default: "
                                     f"<cache_dir>/{KEY_FILE_NAME}")
    restore_at_start: bool = _f(False, "entrypoint only: restore the compile cache while "
                                       "TorchServe starts (its worker waits for the download) "
                                       "instead of in a restore step before it")
    cache_public_key: str | None = _f(None, "PEM file of the fleet's Ed25519 public key: a restore "
                                            "refuses manifests it did not sign (unset: hash checks only, "
                                            "warned at start)")
    cache_signing_key: str | None = _f(None, "PEM file of the fleet's Ed25519 private key: publishes sign "
                                             "with it (unset with cache_public_key: this pod does not publish)")
    publish_after_start: bool = _f(True, "with a cache store, publish once when TorchServe is "
                                         "first ready (a cold start's artifact reaches the "
                                         "store then); the drain publishes regardless")
    # Sidecar HTTP server
    listen_host: str = _f("0.0.0.0", "address of /ready, /live, /metrics, /drain")
    listen_port: int = _f(8090, "port of /ready, /live, /metrics, /drain (0 = any free port)")
    # AWS side effects
    aws_region: str | None = _f(None, "region for the S3, ELBv2 and Auto Scaling clients")
    aws_endpoint_url: str | None = _f(None, "endpoint override (tests: moto server)")
    elb_target_group_arn: str | None = _f(None, "deregister from this target group on notice")
    elb_target_id: str | None = _f(None, "target id; default: this instance's id from IMDS")
    elb_target_port: int | None = _f(None, "target port, when registered with one")
    asg_name: str | None = _f(None, "on-demand Auto Scaling group to grow by one on notice")
    webhook_url: str | None = _f(None, "POST the notice here as JSON on notice")

    def __post_init__(self) -> None:
        for name in ("drain_margin_s", "stop_reserve_s", "min_wait_s",
                     "quiet_s", "signal_grace_s", "http_timeout_s"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.poll_interval_s <= 0:
            raise ConfigError(f"poll_interval_s must be > 0, got {self.poll_interval_s}")
        if not 0 <= self.listen_port <= 65535:
            raise ConfigError(f"listen_port must be 0..65535, got {self.listen_port}")
        if not 1 <= self.imds_token_ttl_s <= 21600:
            raise ConfigError(f"imds_token_ttl_s must be 1..21600, got {self.imds_token_ttl_s}")
        if self.stop_method is StopMethod.PID and not self.torchserve_pid_file:
            raise ConfigError("stop_method=pid needs torchserve_pid_file")
        if self.quiet_polls < 1:
            raise ConfigError(f"quiet_polls must be >= 1, got {self.quiet_polls}")
        if bool(self.cache_store) != bool(self.cache_dir):
            raise ConfigError("cache_store (--cache-store) and cache_dir (--cache-dir) go "
                              f"together; got cache_store={self.cache_store!r} "
                              f"cache_dir={self.cache_dir!r}")
        if (self.cache_public_key or self.cache_signing_key) and not self.cache_store:
            raise ConfigError("cache_public_key and cache_signing_key need cache_store and cache_dir")
        if self.restore_at_start and not self.cache_store:
            raise ConfigError("restore_at_start needs cache_store and cache_dir")

    @property
    def cache_key_path(self) -> Path | None:
        """Where the cache key is read: cache_key, else <cache_dir>/cache-key.json."""
        if self.cache_key:
            return Path(self.cache_key)
        return Path(self.cache_dir) / KEY_FILE_NAME if self.cache_dir else None

    def drain_policy(self) -> DrainPolicy:
        return DrainPolicy(margin_s=self.drain_margin_s,
                           stop_reserve_s=self.stop_reserve_s, min_wait_s=self.min_wait_s,
                           quiet_s=self.quiet_s,
                           quiet_polls=self.quiet_polls)


# Keys that were settings once: named with what replaced them, not merely "unknown".
RETIRED = {
    "publish_reserve_s": "the cache publish now runs beside the in-flight wait, from the drain's "
                         "start, bounded by the stop reserve: nothing is reserved for it, so the key "
                         "is gone; remove it (docs/configuration.md#drain)",
}


def config_from_mapping(values: Mapping[str, object], origin: str = "config") -> SidecarConfig:
    retired = sorted(set(values) & set(RETIRED))
    if retired:
        raise ConfigError(f"{origin}: {retired[0]} was retired: {RETIRED[retired[0]]}")
    # strings=True: the YAML file may quote numbers and booleans as the flags spell them.
    return typed_config.parse(SidecarConfig, values, origin, strings=True)


def load_config(path: Path | None = None,
                overrides: Mapping[str, object] | None = None) -> SidecarConfig:
    values: dict[str, object] = {}
    if path is not None:
        document = yaml.safe_load(path.read_text()) or {}
        if not isinstance(document, dict):
            raise ConfigError(f"{path}: expected a mapping at the top level")
        values.update(document)
    values.update({k: v for k, v in (overrides or {}).items() if v is not None})
    return config_from_mapping(values, origin=str(path) if path else "flags")


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, help="YAML file with SidecarConfig keys")
    typed_config.add_arguments(parser, SidecarConfig)
    for name in RETIRED:  # accepted only to say what replaced it
        parser.add_argument("--" + name.replace("_", "-"), dest=f"retired_{name}",
                            default=None, help=argparse.SUPPRESS)


def config_from_args(args: argparse.Namespace) -> SidecarConfig:
    retired = {name: value for name in RETIRED
               if (value := getattr(args, f"retired_{name}", None)) is not None}
    return load_config(args.config, {**typed_config.flag_values(args, SidecarConfig), **retired})
