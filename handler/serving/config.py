"""The `handler:` section of a model's model-config.yaml, parsed once into a frozen tree.

The section is flat for users (`dtype: float32` next to `max_new_tokens_cap: 512`); the parser
splits the engine's keys into the `EngineConfig` the handler holds, with the checkpoint path and
the device already resolved for this worker, so nothing is rebuilt or re-read later.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from handler import typed_config
from handler.engine.config import EngineConfig
from handler.typed_config import ConfigError

# The compile artifact directory when model-config.yaml names none (the deploy's volume).
CACHE_DIR_ENV = "TS_LLM_CACHE_DIR"
# ... and when the environment names none either: the user's cache (XDG), so a restart on the
# same machine loads what the last start compiled instead of compiling again.
USER_CACHE_SUBDIR = Path("ts-llm") / "aot"
# The resume store and its secret when model-config.yaml names none: a deployment sets them per
# fleet (its bucket, its Secret) without rebuilding the .mar.
RESUME_ENV = {"resume_store": "TS_LLM_RESUME_STORE", "resume_secret_file": "TS_LLM_RESUME_SECRET_FILE"}
# The file TorchServe hands the handler as model_yaml_config: archive.sh writes it and
# torch-model-archiver puts it at the root of the .mar under this name.
MODEL_CONFIG_FILE = "model-config.yaml"
SECTION = "handler"
CHECKPOINT_DIR_NAME = "checkpoint"  # the checkpoint's folder in the model dir when the section names none


@dataclass(frozen=True)
class HandlerConfig:
    # The section's engine keys; checkpoint_dir is the `checkpoint` key (relative to the model
    # directory) and a "cuda" device is the worker's GPU ("cuda:<gpu_id>").
    engine: EngineConfig
    max_new_tokens_cap: int = 1024  # requests asking for more get a 400
    default_max_new_tokens: int = 128
    served_model_name: str = "llm"  # the "model" OpenAI-style clients name
    # The compile artifact directory: the sidecar restores into it, a cold compile installs into
    # it. Unset here: the environment's TS_LLM_CACHE_DIR (the pod's volume), else the user's
    # cache directory (default_cache_dir).
    compile_cache_dir: str | None = None
    # Whether that directory is a shelf of artifacts, one per cache key, least recently used out
    # beyond compile_cache_shelf_mb (handler.cache.shelf): several models on one host each keep
    # theirs. Unset: a shelf in the user's cache directory, one artifact (the sidecar's) elsewhere.
    compile_cache_shelf: bool | None = None
    compile_cache_shelf_mb: int = 4096
    drain_flag_file: str | None = None  # while this file exists, new requests get a retryable 503
    # Continuous batching: how long one call to the worker may go on decoding while every request
    # in it goes on (0: one step per call, each token streamed as it is decoded;
    # ContinuousService.call_seconds), and whether the next step runs while the frontend sends
    # the next call, once calls admit and finish nothing (ContinuousService.step_ahead).
    continuous_call_ms: float = 0.0
    continuous_step_ahead: bool = True
    # Resumable streams (handler.resume): the store a stream cut by the drain leaves its record in,
    # for another replica to go on from (the sidecar's cache_store: s3://bucket/prefix or a
    # directory; unset: a cut stream is not resumable and its events carry no ids); how long a
    # record may be resumed from (seconds from its cut) and how many are kept; the S3 endpoint
    # and region (unset: AWS's). How records are sealed (handler.resume.seal): a file holding the
    # fleet's resume secret (HMAC; what the shipped deployment mounts), or instead the fleet's
    # Ed25519 keys, as the sidecar's cache_public_key and cache_signing_key. Unset store or
    # secret file: the environment's TS_LLM_RESUME_STORE / TS_LLM_RESUME_SECRET_FILE.
    resume_store: str | None = None
    resume_secret_file: str | None = None
    resume_ttl_s: float = 600.0
    resume_max_records: int = 1000
    resume_aws_endpoint_url: str | None = None
    resume_aws_region: str | None = None
    resume_public_key: str | None = None
    resume_signing_key: str | None = None
    # From TorchServe's top-level keys: asyncCommunication -> "async", continuousBatching ->
    # "continuous", neither -> "dynamic" (batchSize/maxBatchDelay).
    batching: Literal["continuous", "async", "dynamic"] = "continuous"

    @classmethod
    def from_model_yaml(cls, model_yaml: dict | None, model_dir: Path, gpu_id: int | None = None,
                        environ: Mapping[str, str] | None = None) -> HandlerConfig:
        """`model_dir`: where a relative `checkpoint` is found; `gpu_id`: TorchServe's GPU for
        this worker; `environ`: where TS_LLM_CACHE_DIR is read (os.environ when None, read now)."""
        model_yaml = model_yaml or {}
        section = model_yaml.get(SECTION) or {}
        if not isinstance(section, dict):
            raise ConfigError(f"{MODEL_CONFIG_FILE} `{SECTION}:` must be a mapping, got {type(section).__name__}")
        typed_config.check_keys(section, SECTION_KEYS, MODEL_CONFIG_FILE, SECTION)
        section = {**section, **_legacy_packing(section)}
        values = {k: v for k, v in section.items() if k in _OWN_KEYS}
        values["engine"] = _engine(section, Path(model_dir), gpu_id)
        values["batching"] = batching_mode(model_yaml)
        environ = os.environ if environ is None else environ
        for key, name in RESUME_ENV.items():
            if values.get(key) is None and environ.get(name):
                values[key] = environ[name]
        if values.get("compile_cache_dir") is None:
            values["compile_cache_dir"] = default_cache_dir(environ)
            if values.get("compile_cache_shelf") is None:
                values["compile_cache_shelf"] = not environ.get(CACHE_DIR_ENV)
        cfg = typed_config.parse(cls, values, MODEL_CONFIG_FILE, SECTION)
        _check_limits(cfg, int(model_yaml.get("batchSize", 1)))
        return cfg


def batching_mode(model_yaml: Mapping) -> str:
    if model_yaml.get("asyncCommunication"):
        return "async"
    return "continuous" if model_yaml.get("continuousBatching") else "dynamic"


def default_cache_dir(environ: Mapping[str, str]) -> str | None:
    """$TS_LLM_CACHE_DIR, else $XDG_CACHE_HOME/ts-llm/aot, else ~/.cache/ts-llm/aot; None
    when the environment names no home at all."""
    if environ.get(CACHE_DIR_ENV):
        return environ[CACHE_DIR_ENV]
    base = environ.get("XDG_CACHE_HOME") or (str(Path(environ["HOME"]) / ".cache") if environ.get("HOME") else None)
    return str(Path(base) / USER_CACHE_SUBDIR) if base else None


def _engine(section: dict, model_dir: Path, gpu_id: int | None) -> EngineConfig:
    checkpoint = typed_config.convert(section.get("checkpoint", CHECKPOINT_DIR_NAME), Path, f"{SECTION}.checkpoint",
                                      MODEL_CONFIG_FILE)
    engine_keys = {k: v for k, v in section.items() if k in _ENGINE_KEYS}
    values = typed_config.typed_values(EngineConfig, engine_keys, MODEL_CONFIG_FILE, SECTION)
    values["checkpoint_dir"] = checkpoint if checkpoint.is_absolute() else model_dir / checkpoint
    if values.get("device") == "cuda":
        values["device"] = f"cuda:{gpu_id or 0}"
    try:
        return EngineConfig(**values)
    except ValueError as err:  # EngineConfig's own checks (ranges, device form)
        raise ConfigError(f"{MODEL_CONFIG_FILE} `{SECTION}:`: {err}") from err


def _check_limits(cfg: HandlerConfig, batch_size: int) -> None:
    if cfg.compile_cache_shelf_mb < 1:
        raise ConfigError(f"compile_cache_shelf_mb must be >= 1, got {cfg.compile_cache_shelf_mb}")
    if cfg.continuous_call_ms < 0:
        raise ConfigError(f"continuous_call_ms must be >= 0 (0: one decode step per call), got {cfg.continuous_call_ms}")
    if cfg.resume_ttl_s <= 0 or cfg.resume_max_records < 1:
        raise ConfigError(f"resume_ttl_s must be > 0 and resume_max_records >= 1, got {cfg.resume_ttl_s} and "
                          f"{cfg.resume_max_records}")
    if cfg.resume_secret_file and (cfg.resume_public_key or cfg.resume_signing_key):
        raise ConfigError("resume_secret_file and resume_public_key/resume_signing_key both seal records: set one")
    if cfg.resume_signing_key and not cfg.resume_public_key:
        raise ConfigError("resume_signing_key without resume_public_key: set the public key too, so that this "
                          "replica checks the records it reads as it signs the ones it writes")
    if not 1 <= cfg.default_max_new_tokens <= cfg.max_new_tokens_cap:
        raise ConfigError("default_max_new_tokens must be between 1 and max_new_tokens_cap")
    if batch_size > cfg.engine.max_batch_size:
        raise ConfigError(f"batchSize {batch_size} exceeds handler.max_batch_size {cfg.engine.max_batch_size}: "
                          "TorchServe would send more requests than the engine has slots")


def _legacy_packing(section: dict) -> dict:
    """packed_weights was a boolean before it had a dtype: true meant the default packing."""
    value = section.get("packed_weights")
    return {"packed_weights": "auto" if value else "off"} if isinstance(value, bool) else {}


_ENGINE_KEYS = frozenset(typed_config.field_names(EngineConfig)) - {"checkpoint_dir"}  # `checkpoint` names it
_OWN_KEYS = frozenset(typed_config.field_names(HandlerConfig)) - {"engine", "batching"}
# Every key a user may write in the section.
SECTION_KEYS = tuple(sorted(_ENGINE_KEYS | _OWN_KEYS | {"checkpoint"}))
