"""How an engine is built from an EngineConfig, in order, each step a function of its inputs:

    build_engine(cfg)
      platform.resolve    `auto` dtype and packing become what measured fastest on this CPU,
                          `auto` quantization the checkpoint's own (its GGUF, else none)
      open_checkpoint     the checkpoint's config, tokenizer and safetensors files, checked
      prepare_model       weights in the resolved dtype, quantized and packed as chosen, KV cache
      artifact_request    the cache key of this worker's compiled artifact, and where to look
      build_steps         compiled prefill and decode: an artifact loaded, or compiled here
      Engine              slots and scheduling over those steps

How the steps are got (build_steps). With artifacts wanted (the serving path), a verified
artifact for this worker's key is loaded (seconds, no tracing; by default in the background
while eager steps serve, see handler.engine.warm_start); otherwise both steps are AOT-compiled
over every serving shape (minutes) and, given a cache dir, installed there for the sidecar to
publish: by default (warm_start: background) in a process of its own while eager steps serve
(handler.engine.compile_process), with warm_start: blocking here, before the engine is
returned. Configurations AOT does not support (freezing, CUDA) use torch.compile with a warm-up
instead.

Either way no shape seen while serving compiles anything: AOT steps have a graph for every
shape the Engine can send, and torch.compile'd ones run under the "fail_on_recompile" stance,
so a recompile is an error, not a silent minute-long stall.
"""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from handler.cache.key import KEY_FILE_NAME, CacheKey
from handler.cache.manifest import MANIFEST_NAME
from handler.engine import aot, artifacts, config, cpp_cache, parallel_compile, platform
from handler.engine.artifacts import ArtifactPlaces, Verdict
from handler.engine.checkpoint import Checkpoint, open_checkpoint
from handler.engine.compile_errors import CompileError, failure_reason
from handler.engine.config import EngineConfig
from handler.engine.engine import Engine
from handler.engine.grammar import Grammars
from handler.engine.model import Transformer
from handler.engine.prepare import prepare_model
from handler.engine.tokenizer import Tokenizer
from handler.engine.warm_start import BackgroundLoad

log = logging.getLogger(__name__)

OnFallback = Callable[[str], None]  # serving eager after a failure (on_compile_error=eager); gets the reason
OnCompiled = Callable[[float], None]  # a background load finished in this many seconds; its steps serve from now on
OnRejected = Callable[[], None]  # counts an artifact not loaded: it failed verification or has another key


@dataclass
class Steps:
    prefill: Callable
    decode: Callable
    # "eager", "inductor" (torch.compile), "aot-compiled" (cold, here), "aot-loaded", "aot-background"
    # (eager steps until the verified artifact, loading in a thread, is in: see warm_start) or
    # "aot-compiling" (eager steps until handler.engine.compile_process has compiled and installed
    # the artifact and a background load has loaded it)
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


@dataclass(frozen=True)
class ArtifactRequest:
    key: CacheKey
    places: ArtifactPlaces
    on_rejected: OnRejected | None = None


@dataclass
class LoadedEngine:
    engine: Engine
    model: Transformer
    steps: Steps
    path: str  # "<cpu profile>/<dtype>/packed-<packing>", logged and exported as a metric label


# ---- the assembly, in order -------------------------------------------------------------------

def build_engine(cfg: EngineConfig, on_fallback: OnFallback | None = None, places: ArtifactPlaces | None = None,
                 on_rejected: OnRejected | None = None, on_compiled: OnCompiled | None = None) -> LoadedEngine:
    """`places`: where compiled artifacts may be found and installed (the serving path); None
    compiles at every start and saves nothing."""
    asked = cfg
    cfg, path = platform.resolve(cfg)
    log.info("engine path %s: %s (asked dtype=%s, packed_weights=%s)", path, platform.detect().describe(), asked.dtype,
             asked.packed_weights)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    ckpt = open_checkpoint(cfg.checkpoint_dir)
    model = prepare_model(ckpt, cfg)
    steps = build_steps(model, cfg, on_fallback, artifact_request(ckpt, cfg, places, on_rejected), on_compiled)
    tokenizer = Tokenizer.from_dir(ckpt.path)
    grammars = Grammars(tokenizer.backend.to_str(), ckpt.args.vocab_size, tokenizer.eos_ids)
    engine = Engine(steps.prefill, steps.decode, tokenizer, cfg.max_batch_size, cfg.max_seq_len,
                    torch.device(cfg.device), copy_prefix=model.copy_prefix, grammars=grammars,
                    prefill_chunk=cfg.prefill_chunk, prefix_caching=cfg.prefix_caching)
    return LoadedEngine(engine, model, steps, path)


def artifact_request(ckpt: Checkpoint, cfg: EngineConfig, places: ArtifactPlaces | None,
                     on_rejected: OnRejected | None) -> ArtifactRequest | None:
    """What build_steps looks for; None when there is no place, or this configuration cannot
    use artifacts (said once when there might have been one to use)."""
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


def build_steps(model: Transformer, cfg: EngineConfig, on_fallback: OnFallback | None = None,
                artifacts_wanted: ArtifactRequest | None = None, on_compiled: OnCompiled | None = None) -> Steps:
    """The model's steps as configured: eager, or compiled (see the module docstring). A failure
    raises CompileError, or serves eager with on_compile_error=eager."""
    if cfg.compile == "eager":
        log.info("compile=eager: serving the uncompiled model, as configured")
        return Steps(model.prefill, model.decode, "eager", 0.0)
    try:
        return _compiled_steps(model, cfg, artifacts_wanted, on_fallback, on_compiled)
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
                    on_fallback: OnFallback | None, on_compiled: OnCompiled | None) -> Steps:
    """torch.compile where AOT cannot serve; else a verified artifact (in the background or
    before returning); else an AOT compile, installed when there is a cache dir."""
    if aot.unsupported_reason(cfg) is not None:
        return _torch_compiled(model, cfg)
    if wanted is None:
        return _aot_cold(model, cfg, None)
    with artifacts.holding(wanted.places):
        path = _find_verified(wanted)
        if path is None and not _compiles_aside(cfg, wanted):
            return _aot_cold(model, cfg, wanted)
        if path is not None and cfg.warm_start == "blocking":
            start = time.perf_counter()
            loaded = aot.load_artifacts(model, path)
            return Steps(loaded.prefill, loaded.decode, "aot-loaded", time.perf_counter() - start, artifact_dir=path)
    # The install lock is let go: the compile process takes it, a background load takes it again.
    if path is None:
        return _compile_aside(model, cfg, wanted, on_fallback, on_compiled)
    return _load_in_background(model, cfg, wanted, path, on_fallback, on_compiled)


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


def _compiles_aside(cfg: EngineConfig, wanted: ArtifactRequest) -> bool:
    """A cold compile runs in a process of its own while eager steps serve when it has a cache
    dir to install into and the configuration serves before compiled steps are in."""
    return cfg.warm_start == "background" and wanted.places.cache_dir is not None


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
            return aot.load_artifacts(model, path)

    background = BackgroundLoad(model, load, cfg.on_compile_error == "eager", on_compiled, on_fallback).start()
    log.info("compile cache: loading artifact %s from %s in the background; serving eager steps until it is loaded",
             wanted.key.digest(), path)
    return Steps(background.step("prefill"), background.step("decode"), "aot-background", 0.0,
                 artifact_dir=path, background=background)


def _compile_aside(model: Transformer, cfg: EngineConfig, wanted: ArtifactRequest,
                   on_fallback: OnFallback | None, on_compiled: OnCompiled | None) -> Steps:
    """Eager steps now; the compiled ones once handler.engine.compile_process has installed the
    artifact and a background load has loaded it (on_compiled gets the seconds from now)."""
    process = start_compile_process(cfg, wanted.key, wanted.places.cache_dir)

    def load() -> aot.AotSteps:
        wait_for_compile(process)
        log.info("compile cache: the compile process (pid %d) finished; loading what it installed", process.pid)
        with artifacts.holding(wanted.places):
            path = _find_verified(wanted)
            if path is None:
                raise aot.AotError(f"the compile process exited 0 but {wanted.places.cache_dir} holds no verified artifact")
            return aot.load_artifacts(model, path)

    background = BackgroundLoad(model, load, cfg.on_compile_error == "eager", on_compiled, on_fallback).start()
    log.warning("compile cache: compiling artifact %s in a separate process (pid %d, at a lower priority; its "
                "progress below as 'compile process:'); serving EAGER steps until it is installed and loaded",
                wanted.key.digest(), process.pid)
    return Steps(background.step("prefill"), background.step("decode"), "aot-compiling", 0.0,
                 artifact_dir=wanted.places.cache_dir, background=background)


def start_compile_process(cfg: EngineConfig, key: CacheKey, dest: Path) -> subprocess.Popen:
    """handler.engine.compile_process for `cfg`; its output goes where this process's goes
    (TorchServe's worker log). Named by module: importing it here would make a cycle."""
    # The same torch thread count as this worker: the graphs guard on it. The CPU the worker
    # needs is kept by the process's lower priority (each compile process runs one thread of
    # Python and g++; handler.engine.parallel_compile adds a second beside it on two cores).
    cmd = [sys.executable, "-m", "handler.engine.compile_process", "--config", config.to_json(cfg), "--key", key.digest(),
           "--dest", str(dest), "--threads", str(torch.get_num_threads()), "--parent", str(os.getpid())]
    return subprocess.Popen(cmd)


def wait_for_compile(process: subprocess.Popen) -> None:
    """Until the compile process exits; a CompileError unless it succeeded."""
    code = process.wait()
    if code != 0:
        raise CompileError(f"the compile process (pid {process.pid}) exited with code {code}; its error is in "
                           "the worker log above, as 'compile process:'")


def _aot_cold(model: Transformer, cfg: EngineConfig, wanted: ArtifactRequest | None) -> Steps:
    start = time.perf_counter()
    dest = wanted.places.cache_dir if wanted is not None else None
    steps = aot.compile_steps(model, cfg) if dest is None else compile_and_install(model, cfg, wanted.key, dest)
    seconds = time.perf_counter() - start
    log.info("AOT-compiled prefill and decode (%d + %d graphs) in %.1f s", len(steps.prefill.graphs),
             len(steps.decode.graphs), seconds)
    return Steps(steps.prefill, steps.decode, "aot-compiled", seconds, artifact_dir=dest)


def compile_and_install(model: Transformer, cfg: EngineConfig, key: CacheKey, dest: Path) -> aot.AotSteps:
    """AOT-compile and install the artifact for `key` in dest (cold start and archive.sh --aot);
    returns the steps loaded back from it. Call it holding dest's lock when others may read it."""
    loaded: list[aot.AotSteps] = []
    model_cache = cpp_cache.inductor_cache_dir()  # where `model`'s own kernels were built
    with cpp_cache.private_build_dirs() as build_dir:
        compiled = parallel_compile.compile_steps(model, cfg, model_cache)

        def write(staged: Path) -> None:
            aot.save_artifacts(compiled, staged, build_dir)
            # Listed in the artifact's manifest: the sidecar's default key file, so after a cold
            # compile it finds the key of what it publishes.
            artifacts.write_key_file(key, staged / KEY_FILE_NAME)
            # Serve what was saved: an artifact that does not load is never installed.
            loaded.append(aot.load_artifacts(model, staged))

        artifacts.install(write, key, dest)
    log.info("compile cache: installed artifact %s in %s", key.digest(), dest)
    return loaded[0]


# ---- torch.compile, for configurations AOT does not support -----------------------------------

def _torch_compiled(model: Transformer, cfg: EngineConfig) -> Steps:
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
            for t, kv_len in ((16, 64), (32, 128)):
                tokens = torch.zeros(b, t, dtype=torch.long, device=device)
                slots, start = torch.arange(b, device=device), torch.zeros(b, dtype=torch.long, device=device)
                prefill(tokens, slots, start, torch.full((b,), t - 1, device=device), kv_len)
            for kv_len in (64, 128):
                decode(torch.zeros(b, dtype=torch.long, device=device), torch.full((b,), kv_len - 1, device=device), kv_len)


def _no_recompile(fn: Callable) -> Callable:
    def call(*args):
        with torch.compiler.set_stance("fail_on_recompile"):
            return fn(*args)

    return call
