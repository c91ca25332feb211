"""Compile artifacts at build time (archive.sh --aot) and the cache key of a built .mar.

The key of a .mar is what a worker serving it computes at load (handler.engine.compiled.artifacts), so
the sidecar can restore the matching artifact before TorchServe starts:

    python -m handler.packing.precompile key model_store/llm.mar --out /var/cache/ts-llm/key.json
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import zipfile
from pathlib import Path

import torch
import yaml

from handler.cache.key import CacheKey, digest_files
from handler.engine.checkpoint import open_checkpoint
from handler.engine.compiled import aot
from handler.engine.compiled.artifacts import WEIGHTS_DIGEST_FILE, artifact_key, write_key_file
from handler.engine.compiled.cold.compile_all import compile_and_install
from handler.engine.compiled.prepare import prepare_model
from handler.engine.config import EngineConfig
from handler.engine.kernels import build as kernels, threads
from handler.engine.platform import auto_quantization, resolve
from handler.serving.config import MODEL_CONFIG_FILE, HandlerConfig


def build_artifact(cfg: EngineConfig, dest: Path) -> CacheKey:
    """AOT-compile the engine a worker of the archive would build (`cfg`, parsed by the caller,
    `auto` resolved here for this CPU profile); install it in dest."""
    cfg = resolve(cfg)[0]
    unsupported = aot.unsupported_reason(cfg)
    if unsupported is not None:
        raise ValueError(f"--aot: cannot build artifacts for this configuration: {unsupported}")
    threads.take(cfg, kernels.load())  # the graphs are compiled for the threads a worker gives torch
    ckpt = open_checkpoint(cfg.checkpoint_dir)
    key = artifact_key(cfg, digest_files(ckpt.digested_files))
    model = prepare_model(ckpt, cfg)
    compile_and_install(model, cfg, key, dest)
    return key


def key_for_mar(mar: Path) -> CacheKey:
    """The key a worker serving this .mar on this machine computes, read without unpacking it."""
    with zipfile.ZipFile(mar) as z:
        model_yaml = yaml.safe_load(z.read(MODEL_CONFIG_FILE)) or {}
        # Parsed as a worker parses it, relative to the archive's root; no environment: the
        # cache dir is no part of the key.
        cfg = HandlerConfig.from_model_yaml(model_yaml, Path(), environ={}).engine
        checkpoint = cfg.checkpoint_dir.as_posix()
        try:
            recorded = json.loads(z.read(f"{checkpoint}/{WEIGHTS_DIGEST_FILE}"))
        except KeyError:
            raise ValueError(f"{mar} has no {checkpoint}/{WEIGHTS_DIGEST_FILE}; rebuild it with archive.sh") from None
        if cfg.quantization == "auto":
            # The worker looks for the GGUF in its unpacked checkpoint; here it is in the listing.
            has_gguf = any(Path(name).parent.as_posix() == checkpoint and name.endswith(".gguf") for name in z.namelist())
            cfg = dataclasses.replace(cfg, quantization=auto_quantization(torch.device(cfg.device).type, has_gguf))
    return artifact_key(cfg, recorded["digest"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m handler.packing.precompile", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    key = sub.add_parser("key", help="print (or write) the cache key of a .mar on this machine")
    key.add_argument("mar", type=Path)
    key.add_argument("--out", type=Path, help="write the key file here (CacheKey.describe() JSON)")
    args = p.parse_args(argv)
    try:
        cache_key = key_for_mar(args.mar)
    except (OSError, ValueError, zipfile.BadZipFile) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.out:
        write_key_file(cache_key, args.out)
    print(json.dumps(cache_key.describe(), indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
