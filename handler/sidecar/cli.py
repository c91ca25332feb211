"""`ts-llm-sidecar`: watch for termination and drain; restore/publish the compile cache.

    ts-llm-sidecar watch --config sidecar.yaml [--margin-s 3 ...]
    ts-llm-sidecar restore --store s3://bucket/prefix --key KEY --dest-dir DIR
    ts-llm-sidecar publish --store s3://bucket/prefix --key KEY --src-dir DIR
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from handler.sidecar import cache_hooks
from handler.sidecar.config import add_config_arguments, config_from_args
from handler.sidecar.errors import ConfigError
from handler.sidecar.watch import Sidecar

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
    watch = commands.add_parser("watch", help="watch for termination, serve /ready, drain")
    add_config_arguments(watch)
    watch.set_defaults(run=run_watch)
    restore = commands.add_parser("restore", help="fetch the compile cache before start")
    _add_cache_arguments(restore, "--dest-dir")
    restore.set_defaults(run=run_restore)
    publish = commands.add_parser("publish", help="upload the compile cache if it is new")
    _add_cache_arguments(publish, "--src-dir")
    publish.set_defaults(run=run_publish)
    return parser


def setup_logging() -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def run_watch(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    with Sidecar(config) as sidecar:
        report = sidecar.run()
    return 0 if report is None else report.exit_code


# ---- cache subcommands: thin wrappers over handler.cache.sync (see cache_hooks.py, HOOK)

def run_restore(args: argparse.Namespace) -> int:
    outcome = cache_hooks.restore(args.store, Path(args.key), Path(args.dest_dir),
                                  args.endpoint_url, args.region)
    log.info("cache restore: %s", outcome)
    return 0  # a miss or an unavailable store means a cold start, not a failed container


def run_publish(args: argparse.Namespace) -> int:
    outcome = cache_hooks.publish(args.store, Path(args.key), Path(args.src_dir),
                                  args.endpoint_url, args.region)
    log.info("cache publish: %s", outcome)
    return 1 if outcome == "store_unavailable" else 0


def _add_cache_arguments(parser: argparse.ArgumentParser, dir_flag: str) -> None:
    parser.add_argument("--store", required=True, help="artifact store, e.g. s3://bucket/prefix")
    parser.add_argument("--key", required=True,
                        help="JSON file with the cache key (CacheKey.describe())")
    parser.add_argument(dir_flag, required=True, help="local cache directory")
    parser.add_argument("--endpoint-url", help="S3 endpoint override (MinIO, moto)")
    parser.add_argument("--region", help="S3 region")


if __name__ == "__main__":
    sys.exit(main())
