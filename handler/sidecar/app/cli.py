"""`ts-llm-sidecar`: watch for termination and drain; restore/publish the compile cache.

    ts-llm-sidecar watch   [--config sidecar.yaml] [--drain-margin-s 5 ...]
    ts-llm-sidecar drain   [--wait] [--timeout-s N]      (the preStop hook)
    ts-llm-sidecar restore --cache-store s3://bucket/prefix --cache-dir DIR
    ts-llm-sidecar publish --cache-store s3://bucket/prefix --cache-dir DIR

Every subcommand takes the same settings (SidecarConfig: a YAML file and/or one flag per key),
so one config file serves the init container, the sidecar and the preStop hook alike.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from handler.sidecar.app import cache_sync
from handler.sidecar.app.sidecar import Sidecar
from handler.sidecar.app.signing_keys import load_signing, may_publish
from handler.sidecar.config import SidecarConfig, add_config_arguments, config_from_args
from handler.sidecar.drain.client import exit_code, request_drain
from handler.sidecar.errors import ConfigError, SidecarError

log = logging.getLogger("handler.sidecar")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging()
    try:
        return int(args.run(args))
    except ConfigError as err:
        log.error("configuration error: %s", err)
        return 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ts-llm-sidecar", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for name, run, text in [
        ("watch", run_watch, "watch for termination, serve /ready, drain"),
        ("drain", run_drain_request, "ask the running sidecar to drain (a preStop hook)"),
        ("restore", run_restore, "fetch the compile cache before TorchServe starts"),
        ("publish", run_publish, "upload the compile cache if it is new"),
    ]:
        command = commands.add_parser(name, help=text, description=text)
        add_config_arguments(command)
        command.set_defaults(run=run)
    drain = commands.choices["drain"]
    drain.add_argument("--wait", action="store_true",
                       help="block until the drain is done; exit with its exit code")
    drain.add_argument("--timeout-s", type=float, default=None,
                       help="give up waiting after this long (default: wait; the kubelet "
                            "bounds a preStop hook by the grace period anyway)")
    return parser


def setup_logging() -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def run_watch(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    if config.restore_at_start:
        raise ConfigError("restore_at_start is for the entrypoint (python -m "
                          "handler.sidecar.app.entrypoint), which starts TorchServe; run "
                          "`ts-llm-sidecar restore` before TorchServe instead")
    with Sidecar(config) as sidecar:
        report = sidecar.run()
    return 0 if report is None else report.exit_code


def run_drain_request(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    try:
        status = request_drain(config.listen_port, wait=args.wait, timeout_s=args.timeout_s)
    except SidecarError as err:
        log.error("drain: %s", err)
        return 1
    print(json.dumps(status, default=str))
    return exit_code(status)


# ---- cache subcommands: thin wrappers over handler.cache.sync (see cache_sync.py)

def run_restore(args: argparse.Namespace) -> int:
    config = _cache_config(config_from_args(args))
    outcome = cache_sync.restore(str(config.cache_store), _key(config),
                                  Path(str(config.cache_dir)), config.aws_endpoint_url,
                                  config.aws_region, load_signing(config))
    log.info("cache restore: %s", outcome)
    return 0  # a miss or an unavailable store means a cold start, not a failed container


def run_publish(args: argparse.Namespace) -> int:
    config = _cache_config(config_from_args(args))
    signing = load_signing(config)
    if not may_publish(signing):
        raise ConfigError("publish needs cache_signing_key when cache_public_key is set")
    try:
        outcome = cache_sync.publish(str(config.cache_store), _key(config),
                                      Path(str(config.cache_dir)), config.aws_endpoint_url,
                                      config.aws_region, signing)
    except cache_sync.ArtifactDirError as err:
        # Nothing to publish, or something that must not be: one line, no traceback.
        log.error("cache publish: %s", err)
        return 1
    log.info("cache publish: %s", outcome)
    return 1 if outcome == "store_unavailable" else 0


def _cache_config(config: SidecarConfig) -> SidecarConfig:
    if not (config.cache_store and config.cache_dir):
        raise ConfigError("restore and publish need cache_store (s3://bucket/prefix or a "
                          "directory) and cache_dir: --cache-store, --cache-dir or the config file")
    return config


def _key(config: SidecarConfig) -> Path:
    key = config.cache_key_path
    assert key is not None, "cache_dir is set, so the key path is known"
    return key


if __name__ == "__main__":
    sys.exit(main())
