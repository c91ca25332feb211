"""Assemble an Engine from an EngineConfig: checkpoint -> model -> compiled steps."""
from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch

from handler.engine import aot, artifacts, platform
from handler.engine.artifacts import ArtifactPlaces
from handler.engine.checkpoint import Checkpoint, load_model, open_checkpoint
from handler.engine.compile import ArtifactRequest, Steps, build_steps
from handler.engine.config import DTYPES, EngineConfig
from handler.engine.engine import Engine
from handler.engine.model import Transformer
from handler.engine.tokenizer import Tokenizer

log = logging.getLogger(__name__)


@dataclass
class LoadedEngine:
    engine: Engine
    model: Transformer
    steps: Steps
    path: str  # "<cpu profile>/<dtype>/packed-<packing>", logged and exported as a metric label


def build_engine(cfg: EngineConfig, on_fallback: Callable[[str], None] | None = None,
                 places: ArtifactPlaces | None = None, on_rejected: Callable[[], None] | None = None,
                 on_compiled: Callable[[float], None] | None = None) -> LoadedEngine:
    """`places`: where compiled artifacts may be found and installed (the serving path); None
    compiles at every start and saves nothing. Callbacks: see compile.build_steps."""
    asked = cfg
    cfg, path = platform.resolve(cfg)
    log.info("engine path %s: %s (asked dtype=%s, packed_weights=%s)", path, platform.detect().describe(), asked.dtype,
             asked.packed_weights)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    ckpt = open_checkpoint(cfg.checkpoint_dir)
    model = prepare_model(ckpt, cfg)
    steps = build_steps(model, cfg, on_fallback, _artifact_request(ckpt, cfg, places, on_rejected), on_compiled)
    tokenizer = Tokenizer.from_dir(ckpt.path)
    engine = Engine(steps.prefill, steps.decode, tokenizer, cfg.max_batch_size, cfg.max_seq_len, torch.device(cfg.device))
    return LoadedEngine(engine, model, steps, path)


def prepare_model(ckpt: Checkpoint, cfg: EngineConfig) -> Transformer:
    """The model as the steps are compiled for it and called with: weights in the resolved
    dtype, packed copies if chosen (the graphs call packed_linear then), KV cache allocated."""
    model = load_model(ckpt, cfg.torch_dtype, cfg.device)
    if cfg.packed_weights != "off":
        model.pack_weights(DTYPES[cfg.packed_weights])
    model.setup_cache(cfg.max_batch_size, cfg.max_seq_len)
    return model


def _artifact_request(ckpt: Checkpoint, cfg: EngineConfig, places: ArtifactPlaces | None,
                      on_rejected: Callable[[], None] | None) -> ArtifactRequest | None:
    if places is None:
        return None
    unsupported = aot.unsupported_reason(cfg)
    if unsupported is not None:
        if cfg.compile != "eager" and places.search():
            log.warning("compile artifacts are not used: %s; compiling at start", unsupported)
        return None
    artifacts.check_layout(places)
    key = artifacts.artifact_key(cfg, artifacts.weights_digest(ckpt))
    return ArtifactRequest(key, places, on_rejected)
