"""Assemble an Engine from an EngineConfig: checkpoint -> model -> compiled steps."""
from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch

from handler.engine import aot, artifacts
from handler.engine.artifacts import ArtifactPlaces
from handler.engine.checkpoint import Checkpoint, load_model, open_checkpoint
from handler.engine.compile import ArtifactRequest, Steps, build_steps
from handler.engine.config import EngineConfig
from handler.engine.engine import Engine
from handler.engine.model import Transformer
from handler.engine.tokenizer import Tokenizer

log = logging.getLogger(__name__)


@dataclass
class LoadedEngine:
    engine: Engine
    model: Transformer
    steps: Steps


def build_engine(cfg: EngineConfig, on_fallback: Callable[[str], None] | None = None,
                 places: ArtifactPlaces | None = None, on_rejected: Callable[[], None] | None = None,
                 on_compiled: Callable[[float], None] | None = None) -> LoadedEngine:
    """`places`: where compiled artifacts may be found and installed (the serving path); None
    compiles at every start and saves nothing. Callbacks: see compile.build_steps."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    ckpt = open_checkpoint(cfg.checkpoint_dir)
    model = load_model(ckpt, cfg.torch_dtype, cfg.device)
    if cfg.packed_weights and not model.pack_weights():
        log.info("packed_weights: oneDNN packing is used for bfloat16 on CPU only; %s on %s uses plain weights",
                 cfg.dtype, cfg.device)
    model.setup_cache(cfg.max_batch_size, cfg.max_seq_len)
    steps = build_steps(model, cfg, on_fallback, _artifact_request(ckpt, cfg, places, on_rejected), on_compiled)
    tokenizer = Tokenizer.from_dir(ckpt.path)
    engine = Engine(steps.prefill, steps.decode, tokenizer, cfg.max_batch_size, cfg.max_seq_len, torch.device(cfg.device))
    return LoadedEngine(engine, model, steps)


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
