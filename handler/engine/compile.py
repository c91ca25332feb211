"""torch.compile of the prefill and decode steps, warmed up at load so no request pays for it.

After warm-up every call runs under the "fail_on_recompile" stance: a shape that would trigger a
recompile while serving is an error, not a silent minute-long stall.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable

import torch

from handler.engine.config import EngineConfig
from handler.engine.model import Transformer

log = logging.getLogger(__name__)


class CompileError(RuntimeError):
    """torch.compile failed and the configuration does not allow eager serving."""


@dataclass
class Steps:
    prefill: Callable
    decode: Callable
    mode: str  # "inductor" or "eager"
    compile_seconds: float
    eager_fallback: bool = False  # True when compile failed and on_compile_error=eager


def build_steps(model: Transformer, cfg: EngineConfig, on_fallback: Callable[[str], None] | None = None) -> Steps:
    if cfg.compile == "eager":
        log.info("compile=eager: serving the uncompiled model, as configured")
        return Steps(model.prefill, model.decode, "eager", 0.0)
    try:
        return _compile(model, cfg)
    except Exception as err:  # Dynamo/Inductor raise many types; all mean "no compiled model"
        reason = f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"
        if cfg.on_compile_error != "eager":
            raise CompileError(f"torch.compile failed ({reason}); fix it or set on_compile_error: eager") from err
        log.error("torch.compile FAILED (%s); serving EAGER because on_compile_error=eager", reason)
        torch._dynamo.reset()
        if on_fallback is not None:
            on_fallback(reason)
        return Steps(model.prefill, model.decode, "eager", 0.0, eager_fallback=True)


def _compile(model: Transformer, cfg: EngineConfig) -> Steps:
    options = {"freezing": cfg.freezing, "max_autotune": cfg.max_autotune}
    cuda = torch.device(cfg.device).type == "cuda"
    decode_mode = "reduce-overhead" if cuda and cfg.cuda_graphs else None
    prefill = torch.compile(model.prefill, fullgraph=True, dynamic=True, options=options)
    decode = torch.compile(model.decode, fullgraph=True, dynamic=True, mode=decode_mode, options=None if decode_mode else options)
    start = time.perf_counter()
    warm_up(prefill, decode, cfg)
    seconds = time.perf_counter() - start
    log.info("compiled prefill and decode in %.1f s", seconds)
    return Steps(_no_recompile(prefill), _no_recompile(decode), "inductor", seconds)


def warm_up(prefill: Callable, decode: Callable, cfg: EngineConfig) -> None:
    """Call each step with the shapes serving will see: batch 1 and batch >= 2 (torch
    specializes size 1), short and longer prompts, short and longer attention windows."""
    device = torch.device(cfg.device)
    batches = [1, 2] if cfg.max_batch_size >= 2 else [1]
    with torch.inference_mode():
        for b in batches:
            for t in (16, 32):
                tokens = torch.zeros(b, t, dtype=torch.long, device=device)
                slots = torch.arange(b, device=device)
                prefill(tokens, slots, torch.full((b,), t - 1, device=device))
            for kv_len in (64, 128):
                decode(torch.zeros(b, dtype=torch.long, device=device), torch.full((b,), kv_len - 1, device=device), kv_len)


def _no_recompile(fn: Callable) -> Callable:
    def call(*args):
        with torch.compiler.set_stance("fail_on_recompile"):
            return fn(*args)

    return call
