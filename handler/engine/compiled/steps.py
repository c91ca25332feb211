"""How a worker gets its prefill and decode steps (build_steps): eager, or compiled.

With artifacts wanted (the serving path), a verified artifact for this worker's key is loaded
(seconds, no tracing; by default in the background while eager steps serve, see
handler.engine.compiled.warm_start); otherwise both steps are AOT-compiled over every serving
shape (minutes) and, given a cache dir, installed there for the sidecar to publish: by default
(warm_start: background) in a process of its own while eager steps serve
(handler.engine.compiled.cold.in_background), with warm_start: blocking here, before the engine is
returned. Configurations AOT does not support (freezing, CUDA) use torch.compile with a warm-up
instead.

Either way no shape seen while serving compiles anything: AOT steps have a graph for every
shape the Engine can send, and torch.compile'd ones run under the "fail_on_recompile" stance,
so a recompile is an error, not a silent minute-long stall.
"""
from __future__ import annotations

import logging
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from handler.cache.manifest import MANIFEST_NAME
from handler.engine.compiled import aot, artifacts, saved_graphs
from handler.engine.compiled.artifact_lookup import (
    ArtifactRequest,
    BackgroundLookup,
    find_verified,
    look_up_in_background,
)
from handler.engine.compiled.cold.compile_all import compile_and_install
from handler.engine.compiled.cold.in_background import wait_for_compile
from handler.engine.compiled.errors import CompileError, failure_reason
from handler.engine.compiled.warm_start import BackgroundLoad
from handler.engine.config import EngineConfig
from handler.engine.kv.pages import page_columns
from handler.engine.model.transformer import Transformer

log = logging.getLogger(__name__)

OnFallback = Callable[[str], None]  # serving eager after a failure (on_compile_error=eager); gets the reason; any thread
# A background load finished in this many seconds; its steps serve from the next one (called on the loading thread)
OnCompiled = Callable[[float], None]


@dataclass
class Steps:
    prefill: Callable
    decode: Callable
    # "eager", "inductor" (torch.compile), "aot-compiled" (cold, here), "aot-loaded", "aot-background"
    # (eager steps until the verified artifact, loading in a thread, is in: see warm_start) or
    # "aot-compiling" (eager steps until handler.engine.compiled.cold.in_background has compiled and
    # installed the artifact and a background load has loaded it)
    mode: str
    compile_seconds: float  # compiling, or loading artifacts
    eager_fallback: bool = False  # True when compile failed and on_compile_error=eager
    artifact_dir: Path | None = None  # the artifact loaded, or installed after a cold compile
    background: BackgroundLoad | None = None  # set while mode is "aot-background" or "aot-compiling"

    @property
    def serving(self) -> str:
        """What these steps run at first, in metrics.ENGINE_MODES terms (a background load
        reports its switch through on_compiled / on_fallback)."""
        if self.eager_fallback:
            return "eager"
        return {"eager": "eager", "aot-background": "loading", "aot-compiling": "compiling"}.get(self.mode, "compiled")


def build_steps(model: Transformer, cfg: EngineConfig, on_fallback: OnFallback | None = None,
                artifacts_wanted: ArtifactRequest | None = None, on_compiled: OnCompiled | None = None,
                lookup: BackgroundLookup | None = None) -> Steps:
    """The model's steps as configured: eager, or compiled (see the module docstring). A failure
    raises CompileError, or serves eager with on_compile_error=eager. `lookup`: look_up_in_background's
    answer when build_engine looked up early (else the lookup happens here)."""
    if cfg.compile == "eager":
        log.info("compile=eager: serving the uncompiled model, as configured")
        return Steps(model.prefill, model.decode, "eager", 0.0)
    try:
        return _compiled_steps(model, cfg, artifacts_wanted, on_fallback, on_compiled, lookup)
    except Exception as err:  # Dynamo/Inductor raise many types; all mean "no compiled model"
        return _eager_after_failure(model, cfg, err, on_fallback)


def _eager_after_failure(model: Transformer, cfg: EngineConfig, err: Exception, on_fallback: OnFallback | None) -> Steps:
    reason = failure_reason(err)
    if cfg.on_compile_error != "eager":
        raise CompileError(f"compiling or loading the compiled model failed ({reason}); "
                           "fix it or set on_compile_error: eager") from err
    log.error("compiling or loading the compiled model FAILED (%s); serving EAGER because "
              "on_compile_error=eager", reason)
    torch._dynamo.reset()
    if on_fallback is not None:
        on_fallback(reason)
    return Steps(model.prefill, model.decode, "eager", 0.0, eager_fallback=True)


# ---- which compiled steps ---------------------------------------------------------------------

def _compiled_steps(model: Transformer, cfg: EngineConfig, wanted: ArtifactRequest | None,
                    on_fallback: OnFallback | None, on_compiled: OnCompiled | None, lookup: BackgroundLookup | None) -> Steps:
    """torch.compile where AOT cannot serve; else a verified artifact (in the background or
    before returning); else an AOT compile, installed when there is a cache dir."""
    if aot.unsupported_reason(cfg) is not None:
        return _torch_compiled(model, cfg)
    if wanted is None:
        return _aot_cold(model, cfg, None)
    lookup = lookup if lookup is not None else look_up_in_background(cfg, wanted)
    if lookup is not None:
        if lookup.error is not None:
            raise lookup.error
        if lookup.compiling is not None:
            return _compile_in_background(model, cfg, wanted, lookup.compiling, on_fallback, on_compiled)
        assert lookup.found is not None, "a background lookup fails, finds or starts a compile"
        return _load_in_background(model, cfg, wanted, lookup.found, on_fallback, on_compiled)
    with artifacts.holding(wanted.places):
        path = find_verified(wanted)
        if path is None:
            return _aot_cold(model, cfg, wanted)
        if cfg.warm_start == "blocking":
            start = time.perf_counter()
            loaded = saved_graphs.load_artifacts(model, path)
            return Steps(loaded.prefill, loaded.decode, "aot-loaded", time.perf_counter() - start, artifact_dir=path)
    # Background, with nowhere to install (so no background lookup): the lock is taken again to load.
    assert path is not None  # returned above; the checker assumes holding() may swallow an exception
    return _load_in_background(model, cfg, wanted, path, on_fallback, on_compiled)


def _load_in_background(model: Transformer, cfg: EngineConfig, wanted: ArtifactRequest, path: Path,
                        on_fallback: OnFallback | None, on_compiled: OnCompiled | None) -> Steps:
    verified_manifest = (path / MANIFEST_NAME).read_bytes()

    def load() -> aot.AotSteps:
        # The lock was let go in between. Installs and restores replace the whole directory,
        # manifest included, so the same manifest means the same verified files (re-hashing them
        # would compete with the first requests for the CPU).
        with artifacts.holding(wanted.places):
            if (path / MANIFEST_NAME).read_bytes() != verified_manifest:
                raise aot.AotError(f"{path} was replaced after it was verified")
            return saved_graphs.load_artifacts(model, path)

    background = BackgroundLoad(model, load, cfg.on_compile_error == "eager", on_compiled, on_fallback).start()
    log.info("compile cache: loading artifact %s from %s in the background; serving eager steps until it is loaded",
             wanted.key.digest(), path)
    return Steps(background.step("prefill"), background.step("decode"), "aot-background", 0.0,
                 artifact_dir=path, background=background)


def _compile_in_background(model: Transformer, cfg: EngineConfig, wanted: ArtifactRequest, process: subprocess.Popen,
                   on_fallback: OnFallback | None, on_compiled: OnCompiled | None) -> Steps:
    """Eager steps now; the compiled ones once `process` (handler.engine.compiled.cold.in_background)
    has installed the artifact and a background load has loaded it (on_compiled gets the seconds
    from now)."""

    def load() -> aot.AotSteps:
        wait_for_compile(process)
        log.info("compile cache: the compile process (pid %d) finished; loading what it installed", process.pid)
        with artifacts.holding(wanted.places):
            path = find_verified(wanted)
            if path is None:
                raise aot.AotError(f"the compile process exited 0 but {wanted.places.cache_dir} holds no verified artifact")
            return saved_graphs.load_artifacts(model, path)

    background = BackgroundLoad(model, load, cfg.on_compile_error == "eager", on_compiled, on_fallback).start()
    log.warning("compile cache: compiling artifact %s in a separate process (pid %d, at a lower priority; its "
                "progress below as 'compile process:'); serving EAGER steps until it is installed and loaded",
                wanted.key.digest(), process.pid)
    return Steps(background.step("prefill"), background.step("decode"), "aot-compiling", 0.0,
                 artifact_dir=wanted.places.cache_dir, background=background)


def _aot_cold(model: Transformer, cfg: EngineConfig, wanted: ArtifactRequest | None) -> Steps:
    start = time.perf_counter()
    dest = wanted.places.cache_dir if wanted is not None else None
    if wanted is None or dest is None:
        steps = aot.compile_steps(model, cfg)
    else:
        steps = compile_and_install(model, cfg, wanted.key, dest)
        wanted.places.used(dest)
    seconds = time.perf_counter() - start
    log.info("AOT-compiled prefill and decode (%d + %d graphs) in %.1f s", len(steps.prefill.graphs),
             len(steps.decode.graphs), seconds)
    return Steps(steps.prefill, steps.decode, "aot-compiled", seconds, artifact_dir=dest)


# ---- torch.compile, for configurations AOT does not support -----------------------------------

def _torch_compiled(model: Transformer, cfg: EngineConfig) -> Steps:
    options: dict[str, Any] = {"freezing": cfg.freezing, "max_autotune": cfg.max_autotune}
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
    with torch.no_grad(), aot.trace_settings():  # no_grad as the Engine calls them: grad mode is part of the guards
        for b in batches:
            pages = torch.zeros(b, page_columns(cfg.max_seq_len), dtype=torch.long, device=device)
            for t, kv_len in ((16, 64), (32, 128)):
                tokens = torch.zeros(b, t, dtype=torch.long, device=device)
                start = torch.zeros(b, dtype=torch.long, device=device)
                prefill(tokens, pages, start, torch.full((b,), t - 1, device=device), kv_len)
            for kv_len in (64, 128):
                decode(torch.zeros(b, dtype=torch.long, device=device), pages, torch.full((b,), kv_len - 1, device=device), kv_len)


def _no_recompile(fn: Callable) -> Callable:
    def call(*args):
        with torch.compiler.set_stance("fail_on_recompile"):
            return fn(*args)

    return call
