"""Compiled prefill and decode: loaded or compiled when the worker loads.

With artifacts wanted (the serving path), a verified artifact for this worker's key is loaded
(seconds, no tracing; by default in the background while eager steps serve, see warm_start);
otherwise both steps are AOT-compiled over every serving shape
(minutes) and, given a cache dir, installed there for the sidecar to publish. Configurations
AOT does not support (freezing, CUDA) use torch.compile with a warm-up instead.

Either way no shape seen while serving compiles anything: AOT steps have a graph for every
shape the Engine can send, and torch.compile'd ones run under the "fail_on_recompile" stance,
so a recompile is an error, not a silent minute-long stall.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from handler.cache.key import CacheKey
from handler.cache.manifest import MANIFEST_NAME
from handler.engine import aot, artifacts, cpp_cache
from handler.engine.artifacts import ArtifactPlaces, Verdict
from handler.engine.config import EngineConfig
from handler.engine.model import Transformer
from handler.engine.warm_start import BackgroundLoad, failure_reason

log = logging.getLogger(__name__)


class CompileError(RuntimeError):
    """torch.compile failed and the configuration does not allow eager serving."""


@dataclass
class Steps:
    prefill: Callable
    decode: Callable
    # "eager", "inductor" (torch.compile), "aot-compiled" (cold), "aot-loaded" or "aot-background"
    # (eager steps until the verified artifact, loading in a thread, is in: see warm_start)
    mode: str
    compile_seconds: float  # compiling, or loading artifacts
    eager_fallback: bool = False  # True when compile failed and on_compile_error=eager
    artifact_dir: Path | None = None  # the artifact loaded, or installed after a cold compile
    background: BackgroundLoad | None = None  # set while mode is "aot-background"


@dataclass(frozen=True)
class ArtifactRequest:
    key: CacheKey
    places: ArtifactPlaces
    on_rejected: Callable[[], None] | None = None  # counts an artifact that failed verification


def build_steps(model: Transformer, cfg: EngineConfig, on_fallback: Callable[[str], None] | None = None,
                artifacts_wanted: ArtifactRequest | None = None, on_compiled: Callable[[float], None] | None = None) -> Steps:
    """on_fallback(reason): serving eager after a failure (on_compile_error=eager).
    on_compiled(seconds): a background load finished and its steps serve from now on."""
    if cfg.compile == "eager":
        log.info("compile=eager: serving the uncompiled model, as configured")
        return Steps(model.prefill, model.decode, "eager", 0.0)
    try:
        return _compiled(model, cfg, artifacts_wanted, on_fallback, on_compiled)
    except Exception as err:  # Dynamo/Inductor raise many types; all mean "no compiled model"
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


def _compiled(model: Transformer, cfg: EngineConfig, wanted: ArtifactRequest | None,
              on_fallback: Callable[[str], None] | None, on_compiled: Callable[[float], None] | None) -> Steps:
    if aot.unsupported_reason(cfg) is not None:
        return _compile(model, cfg)
    if wanted is None:
        return _aot_cold(model, cfg, None)
    with artifacts.holding(wanted.places):
        path = _find_verified(wanted)
        if path is None:
            return _aot_cold(model, cfg, wanted)
        if cfg.warm_start == "background":
            return _load_in_background(model, cfg, wanted, path, on_fallback, on_compiled)
        start = time.perf_counter()
        return _aot_result(aot.load_artifacts(model, path), "aot-loaded", time.perf_counter() - start, path)


def _find_verified(wanted: ArtifactRequest) -> Path | None:
    """The first verified artifact for the key; None (logged once) when there is none."""
    checked = []
    for path in wanted.places.search():
        found = artifacts.check_dir(path, wanted.key)
        artifacts.log_check(found, wanted.key, wanted.on_rejected)
        if found.verdict == Verdict.VERIFIED:
            return path
        checked.append(f"{path}: {found.verdict}")
    log.warning("compile cache: no usable artifact for key %s (%s); compiling cold, this takes minutes",
                wanted.key.digest(), "; ".join(checked) or "no place to look")
    return None


def _load_in_background(model: Transformer, cfg: EngineConfig, wanted: ArtifactRequest, path: Path,
                        on_fallback: Callable[[str], None] | None, on_compiled: Callable[[float], None] | None) -> Steps:
    verified_manifest = (path / MANIFEST_NAME).read_bytes()

    def load() -> aot.AotSteps:
        # The lock was let go in between. Installs and restores replace the whole directory,
        # manifest included, so the same manifest means the same verified files (re-hashing them
        # would compete with the first requests for the CPU).
        with artifacts.holding(wanted.places):
            if (path / MANIFEST_NAME).read_bytes() != verified_manifest:
                raise aot.AotError(f"{path} was replaced after it was verified")
            return aot.load_artifacts(model, path)

    background = BackgroundLoad(model, load, cfg.on_compile_error == "eager", on_compiled, on_fallback).start()
    log.info("compile cache: loading artifact %s from %s in the background; serving eager steps until it is loaded",
             wanted.key.digest(), path)
    return Steps(background.step("prefill"), background.step("decode"), "aot-background", 0.0,
                 artifact_dir=path, background=background)


def _aot_cold(model: Transformer, cfg: EngineConfig, wanted: ArtifactRequest | None) -> Steps:
    start = time.perf_counter()
    dest = wanted.places.cache_dir if wanted is not None else None
    steps = aot.compile_steps(model, cfg) if dest is None else compile_and_install(model, cfg, wanted.key, dest)
    seconds = time.perf_counter() - start
    log.info("AOT-compiled prefill and decode (%d + %d graphs) in %.1f s", len(steps.prefill.graphs),
             len(steps.decode.graphs), seconds)
    return _aot_result(steps, "aot-compiled", seconds, dest)


def compile_and_install(model: Transformer, cfg: EngineConfig, key: CacheKey, dest: Path) -> aot.AotSteps:
    """AOT-compile and install the artifact for `key` in dest (cold start and archive.sh --aot);
    returns the steps loaded back from it. Call it holding dest's lock when others may read it."""
    loaded: list[aot.AotSteps] = []
    with cpp_cache.private_build_dirs() as build_dir:
        compiled = aot.compile_steps(model, cfg)

        def write(staged: Path) -> None:
            aot.save_artifacts(compiled, staged, build_dir)
            artifacts.write_key_file(key, staged / artifacts.KEY_FILE_NAME)
            # Serve what was saved: an artifact that does not load is never installed.
            loaded.append(aot.load_artifacts(model, staged))

        artifacts.install(write, key, dest)
    log.info("compile cache: installed artifact %s in %s", key.digest(), dest)
    return loaded[0]


def _aot_result(steps: aot.AotSteps, mode: str, seconds: float, path: Path | None) -> Steps:
    return Steps(steps.prefill, steps.decode, mode, seconds, artifact_dir=path)


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
    with torch.no_grad():  # as the Engine calls them: grad mode is part of the guards
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
