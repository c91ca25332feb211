"""The cold compile: every serving shape's graphs compiled (side by side where there are cores:
handler.engine.compiled.cold.side_by_side), saved with the C++ they built and installed as a
verified artifact for a key. A worker runs it before serving (warm_start: blocking), the
compile process while the worker serves eager steps, archive.sh --aot at build time."""
from __future__ import annotations

import logging
from pathlib import Path

from handler.cache.key import KEY_FILE_NAME, CacheKey
from handler.engine.compiled import aot, artifacts, cpp_cache, saved_graphs
from handler.engine.compiled.cold import side_by_side
from handler.engine.config import EngineConfig
from handler.engine.model.transformer import Transformer

log = logging.getLogger(__name__)


def compile_and_install(model: Transformer, cfg: EngineConfig, key: CacheKey, dest: Path,
                        fork_threads: int | None = None) -> aot.AotSteps:
    """AOT-compile and install the artifact for `key` in dest (cold start and archive.sh --aot);
    returns the steps, loaded back from the files the artifact holds: an artifact of graphs that
    do not load is never installed. Call it holding dest's lock when others may read it.
    `fork_threads`: see side_by_side.compile_in_parts."""
    model_cache = cpp_cache.inductor_cache_dir()  # where `model`'s own kernels were built
    with cpp_cache.private_build_dirs() as build_dir:
        saved = side_by_side.compile_in_parts(model, cfg, model_cache, build_dir, fork_threads)

        def write(staged: Path) -> None:
            saved_graphs.save_artifacts(saved, staged, build_dir)
            # Listed in the artifact's manifest: the sidecar's default key file, so after a cold
            # compile it finds the key of what it publishes.
            artifacts.write_key_file(key, staged / KEY_FILE_NAME)

        artifacts.install(write, key, dest)
    log.info("compile cache: installed artifact %s in %s", key.digest(), dest)
    return saved_graphs.serving_steps(model, saved)
