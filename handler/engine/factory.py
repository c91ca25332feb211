"""Assemble an Engine from an EngineConfig: checkpoint -> model -> compiled steps."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

import torch

from handler.engine.checkpoint import load_model, open_checkpoint
from handler.engine.compile import Steps, build_steps
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


def build_engine(cfg: EngineConfig, on_fallback: Callable[[str], None] | None = None) -> LoadedEngine:
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    ckpt = open_checkpoint(cfg.checkpoint_dir)
    model = load_model(ckpt, cfg.torch_dtype, cfg.device)
    model.setup_cache(cfg.max_batch_size, cfg.max_seq_len)
    steps = build_steps(model, cfg, on_fallback)
    tokenizer = Tokenizer.from_dir(ckpt.path)
    engine = Engine(steps.prefill, steps.decode, tokenizer, cfg.max_batch_size, cfg.max_seq_len, torch.device(cfg.device))
    return LoadedEngine(engine, model, steps)
