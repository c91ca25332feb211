"""How an engine is built from an EngineConfig, in order, each step a function of its inputs:

    build_engine(cfg)
      platform.resolve    `auto` dtype and packing become what measured fastest on this CPU,
                          `auto` quantization the checkpoint's own (its GGUF, else none)
      open_checkpoint     the checkpoint's config, tokenizer and safetensors files, checked
      artifact_request    the cache key of this worker's compiled artifact, and where to look
                          (handler.engine.compiled.artifact_lookup, as look_up_in_background)
      look_up_in_background (warm_start: background) the verified artifact, or the compile process
                          started at once when there is none: its start overlaps prepare_model
      prepare_model       weights in the resolved dtype, quantized and packed as chosen, KV cache
      build_steps         compiled prefill and decode: an artifact loaded, or compiled here
      Engine              slots and scheduling over those steps

How build_steps gets the steps (eager, an artifact loaded now or in the background, a cold
compile here or in a process of its own, torch.compile): handler.engine.compiled.steps.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from handler.engine import platform
from handler.engine.checkpoint import open_checkpoint
from handler.engine.compiled.artifact_lookup import OnRejected, artifact_request, look_up_in_background
from handler.engine.compiled.artifacts import ArtifactPlaces
from handler.engine.compiled.prepare import prepare_model
from handler.engine.compiled.steps import OnCompiled, OnFallback, Steps, build_steps
from handler.engine.config import EngineConfig
from handler.engine.engine import Engine
from handler.engine.grammar import Grammars
from handler.engine.kernels import build as kernels, threads
from handler.engine.kernels.threads import ThreadSettings
from handler.engine.kv.pages import pages_for
from handler.engine.model.transformer import Transformer
from handler.engine.tokenizer import Tokenizer

log = logging.getLogger(__name__)


@dataclass
class LoadedEngine:
    engine: Engine
    model: Transformer
    steps: Steps
    path: str  # "<cpu profile>/<dtype>/packed-<packing>", logged and exported as a metric label
    threads: ThreadSettings  # how many threads a step runs on and how they wait, logged and exported


def build_engine(cfg: EngineConfig, on_fallback: OnFallback | None = None, places: ArtifactPlaces | None = None,
                 on_rejected: OnRejected | None = None, on_compiled: OnCompiled | None = None) -> LoadedEngine:
    """`places`: where compiled artifacts may be found and installed (the serving path); None
    compiles at every start and saves nothing."""
    asked = cfg
    cfg, path = platform.resolve(cfg)
    log.info("engine path %s: %s (asked dtype=%s, packed_weights=%s)", path, platform.detect().describe(), asked.dtype,
             asked.packed_weights)
    cpu = torch.device(cfg.device).type == "cpu"
    settings = threads.take(cfg, kernels.load()) if cpu else threads.in_force(cfg)
    log.info("engine threads: %s", settings.describe())
    if not settings.bounded:
        log.warning("engine threads wait by spinning (%s): beside another busy process tokens come seconds apart; "
                    "start the worker with GOMP_SPINCOUNT=%d in its environment (the launcher and the sidecar's "
                    "entrypoint set it)", settings.wait, threads.SPIN_COUNT)
    ckpt = open_checkpoint(cfg.checkpoint_dir)
    wanted = artifact_request(ckpt, cfg, places, on_rejected)
    lookup = look_up_in_background(cfg, wanted)
    try:
        model = prepare_model(ckpt, cfg)
    except BaseException:
        if lookup is not None and lookup.compiling is not None:
            lookup.compiling.kill()  # nobody would load what it compiles
        raise
    steps = build_steps(model, cfg, on_fallback, wanted, on_compiled, lookup)
    tokenizer = Tokenizer.from_dir(ckpt.path)
    grammars = Grammars(tokenizer.backend.to_str(), ckpt.args.vocab_size, tokenizer.eos_ids)
    engine = Engine(steps.prefill, steps.decode, tokenizer, cfg.max_batch_size, cfg.max_seq_len,
                    torch.device(cfg.device), copy_page=model.copy_page, grammars=grammars,
                    prefill_chunk=cfg.prefill_chunk, prefix_caching=cfg.prefix_caching, pages=pages_for(cfg.kv_budget),
                    prefill_stall_s=cfg.prefill_stall_ms / 1000 if cpu and cfg.prefill_stall_ms else None)
    return LoadedEngine(engine, model, steps, path, settings)
