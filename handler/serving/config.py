"""The `handler:` section of a model's model-config.yaml, parsed once into a frozen dataclass."""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from handler.engine.config import EngineConfig

# The compile artifact directory when model-config.yaml names none (the deploy's volume).
CACHE_DIR_ENV = "TS_LLM_CACHE_DIR"


class ConfigError(ValueError):
    """The model configuration is invalid; the message names the key and what to change."""


@dataclass(frozen=True)
class HandlerConfig:
    checkpoint: str = "checkpoint"  # checkpoint directory, relative to the model directory
    dtype: str = "auto"  # "auto" (the CPU profile's fastest: handler.engine.platform), "bfloat16" or "float32"
    device: str = "cpu"  # "cpu" or "cuda" (the worker's GPU id from TorchServe is used)
    max_batch_size: int = 32
    max_seq_len: int = 2048
    compile: str = "inductor"  # "inductor" or "eager"
    on_compile_error: str = "raise"  # "raise" or "eager" (logged at ERROR and counted)
    warm_start: str = "background"  # "background": serve eager while a verified artifact loads; or "blocking"
    freezing: bool = False  # true: no AOT artifacts (frozen graphs cannot be saved)
    max_autotune: bool = False
    # oneDNN-packed projection weights for several-row calls (CPU): "auto", "off", "bfloat16",
    # "float32"; true/false are read as auto/off
    packed_weights: str = "auto"
    cuda_graphs: bool = True
    threads: int | None = None
    max_new_tokens_cap: int = 1024  # requests asking for more get a 400
    default_max_new_tokens: int = 128
    served_model_name: str = "llm"  # the "model" OpenAI-style clients name
    # The compile artifact directory: the sidecar restores into it, a cold compile installs into
    # it. Unset here: the environment's TS_LLM_CACHE_DIR (the pod's volume), if any.
    compile_cache_dir: str | None = None
    drain_flag_file: str | None = None  # while this file exists, new requests get a retryable 503
    continuous_batching: bool = True  # mirrors TorchServe's top-level continuousBatching key

    @classmethod
    def from_model_yaml(cls, model_yaml: dict | None, environ: Mapping[str, str] | None = None) -> "HandlerConfig":
        """`environ`: where TS_LLM_CACHE_DIR is read (os.environ when None, read now)."""
        model_yaml = model_yaml or {}
        section = model_yaml.get("handler") or {}
        if not isinstance(section, dict):
            raise ConfigError(f"model-config.yaml `handler:` must be a mapping, got {type(section).__name__}")
        allowed = {f.name for f in dataclasses.fields(cls)} - {"continuous_batching"}
        unknown = sorted(set(section) - allowed)
        if unknown:
            raise ConfigError(f"unknown key(s) {', '.join(unknown)} in model-config.yaml `handler:`; allowed: {', '.join(sorted(allowed))}")
        section = {**section, **_legacy_packing(section)}
        values = {k: _check_type(k, v) for k, v in section.items()}
        values["continuous_batching"] = bool(model_yaml.get("continuousBatching", False))
        env_cache_dir = (os.environ if environ is None else environ).get(CACHE_DIR_ENV)
        if values.get("compile_cache_dir") is None and env_cache_dir:
            values["compile_cache_dir"] = env_cache_dir
        cfg = cls(**values)
        if not 1 <= cfg.default_max_new_tokens <= cfg.max_new_tokens_cap:
            raise ConfigError("default_max_new_tokens must be between 1 and max_new_tokens_cap")
        batch_size = int(model_yaml.get("batchSize", 1))
        if batch_size > cfg.max_batch_size:
            raise ConfigError(f"batchSize {batch_size} exceeds handler.max_batch_size {cfg.max_batch_size}: "
                              "TorchServe would send more requests than the engine has slots")
        return cfg

    def engine_config(self, model_dir: Path, gpu_id: int | None) -> EngineConfig:
        device = f"cuda:{gpu_id or 0}" if self.device == "cuda" else self.device
        checkpoint = Path(self.checkpoint) if Path(self.checkpoint).is_absolute() else Path(model_dir) / self.checkpoint
        try:
            return EngineConfig(checkpoint, self.dtype, device, self.max_batch_size, self.max_seq_len, self.compile,
                                self.on_compile_error, self.warm_start, self.freezing, self.max_autotune,
                                self.packed_weights, self.cuda_graphs, self.threads)
        except ValueError as err:
            raise ConfigError(f"model-config.yaml `handler:`: {err}") from err


def _legacy_packing(section: dict) -> dict:
    """packed_weights was a boolean before it had a dtype: true meant the default packing."""
    value = section.get("packed_weights")
    return {"packed_weights": "auto" if value else "off"} if isinstance(value, bool) else {}


_TYPES = {f.name: f.type for f in dataclasses.fields(HandlerConfig)}


def _check_type(key: str, value):
    kind = _TYPES[key]
    expected = {"str": str, "int": int, "bool": bool, "int | None": (int, type(None)), "str | None": (str, type(None))}[kind]
    if isinstance(value, bool) and kind.startswith("int"):
        raise ConfigError(f"handler.{key} must be an integer, got {value!r}")
    if not isinstance(value, expected):
        raise ConfigError(f"handler.{key} must be {kind}, got {value!r}")
    return value
