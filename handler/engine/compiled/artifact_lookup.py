"""Which compiled artifact a worker wants, where it looks, and the cold compile started in the background.

    artifact_request       the cache key of this worker's artifact (config, torch, CPU, weights)
                           and the places to look: none when this configuration cannot use one
    find_verified          the first verified artifact for the key in those places
    look_up_in_background  warm_start: background with a cache dir to install into: the verified
                           artifact, or the compile process (handler.engine.compiled.cold.in_background)
                           started at once when there is none, before the worker prepares its model
                           (handler.engine.factory), so that the two starts overlap (~6 s of a cold
                           start's compiled speed)
"""
from __future__ import annotations

import logging
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from handler.cache.check import Verdict
from handler.cache.key import CacheKey
from handler.engine.checkpoint import Checkpoint
from handler.engine.compiled import aot, artifacts
from handler.engine.compiled.artifacts import ArtifactPlaces
from handler.engine.compiled.cold.in_background import start_compile_process
from handler.engine.config import EngineConfig

log = logging.getLogger(__name__)

OnRejected = Callable[[], None]  # counts an artifact not loaded: it failed verification or has another key


@dataclass(frozen=True)
class ArtifactRequest:
    key: CacheKey
    places: ArtifactPlaces
    on_rejected: OnRejected | None = None


@dataclass(frozen=True)
class BackgroundLookup:
    """The background path's artifact lookup (warm_start: background, with a cache dir to install
    into), made before the model is prepared: with no verified artifact the compile process
    starts at once, and its own start (imports, its model: ~6 s) overlaps this worker's."""
    found: Path | None = None  # the verified artifact, to load in the background
    compiling: subprocess.Popen | None = None  # else the compile process, started
    error: Exception | None = None  # the lookup failed: raised in build_steps, whose boundary handles it


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
    return ArtifactRequest(key, places.for_key(key), on_rejected)


def look_up_in_background(cfg: EngineConfig, wanted: ArtifactRequest | None) -> BackgroundLookup | None:
    """The lookup of the background path (None on the others); a failure is kept, not raised."""
    if wanted is None or not compiles_in_background(cfg, wanted):
        return None
    cache_dir = wanted.places.cache_dir
    assert cache_dir is not None, "compiles_in_background: only with a cache dir to install into"
    try:
        with artifacts.holding(wanted.places):
            found = find_verified(wanted)
            if found is not None:
                return BackgroundLookup(found=found)
            # The install lock is let go: the compile process takes it, the background load again.
            return BackgroundLookup(compiling=start_compile_process(cfg, wanted.key, cache_dir))
    except Exception as err:  # locks, files, the process's start: compile failures like any other
        return BackgroundLookup(error=err)


def find_verified(wanted: ArtifactRequest) -> Path | None:
    """The first verified artifact for the key (about to be loaded: marked used); None (logged
    once) when there is none."""
    checked = []
    for path in wanted.places.search():
        found = artifacts.check_dir(path, wanted.key)
        artifacts.log_check(found, wanted.key, wanted.on_rejected)
        if found.verdict == Verdict.VERIFIED:
            wanted.places.used(path)
            return path
        checked.append(f"{path}: {found.verdict}")
    log.warning("compile cache: no usable artifact for key %s (%s); compiling cold, this takes minutes",
                wanted.key.digest(), "; ".join(checked) or "no place to look")
    return None


def compiles_in_background(cfg: EngineConfig, wanted: ArtifactRequest) -> bool:
    """A cold compile runs in a process of its own while eager steps serve when it has a cache
    dir to install into and the configuration serves before compiled steps are in."""
    return cfg.warm_start == "background" and wanted.places.cache_dir is not None
