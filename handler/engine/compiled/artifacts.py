"""Which compiled artifacts a worker may load: the cache key, verified lookup, installation.

An artifact directory holds handler.engine.compiled.aot's files plus handler.cache's manifest, which
names the artifact's key and the SHA-256 of every file. It gets there three ways: the sidecar
restores it from the store, archive.sh packs it into the .mar, or a worker installs it after a
cold compile (and the sidecar publishes it). A worker loads one only when the key is its own
and every file matches the manifest: the files are code.
"""
from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from handler.cache import shelf
from handler.cache.check import Checked, Verdict, check_artifact
from handler.cache.install import clear_leftovers, install_lock, replace_dir, staging_dir
from handler.cache.key import CacheKey, current_key, digest_files
from handler.cache.manifest import MANIFEST_NAME, build_manifest
from handler.engine import platform
from handler.engine.checkpoint import Checkpoint
from handler.engine.compiled import aot
from handler.engine.config import EngineConfig
from handler.engine.kernels.threads import graph_threads
from handler.files import write_atomic

log = logging.getLogger(__name__)

WEIGHTS_DIGEST_FILE = "weights-digest.json"  # beside the weights; written by archive.sh
MAR_ARTIFACT_DIR = "aot"  # the artifact folder inside a .mar (archive.sh --aot)


# ---- the key ----------------------------------------------------------------------------------

def write_weights_digest(ckpt: Checkpoint, dest_dir: Path) -> str:
    """Hash the weights once, at build time, so workers need not re-read them at each start."""
    digest = digest_files(ckpt.digested_files)
    files = {p.name: p.stat().st_size for p in ckpt.digested_files}
    write_atomic(dest_dir / WEIGHTS_DIGEST_FILE, json.dumps({"digest": digest, "files": files}, indent=1) + "\n")
    return digest


def weights_digest(ckpt: Checkpoint) -> str:
    """The digest archive.sh recorded, if it still describes these files (names and sizes, a
    stat-only check); otherwise hash the weights now."""
    recorded = _recorded_digest(ckpt)
    if recorded is not None:
        return recorded
    log.info("hashing the weights (no valid %s beside them; archive.sh writes one)", WEIGHTS_DIGEST_FILE)
    return digest_files(ckpt.digested_files)


def _recorded_digest(ckpt: Checkpoint) -> str | None:
    try:
        doc = json.loads((ckpt.path / WEIGHTS_DIGEST_FILE).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        log.warning("ignoring unreadable %s: %s", WEIGHTS_DIGEST_FILE, err)
        return None
    actual = {p.name: p.stat().st_size for p in ckpt.digested_files}
    if doc.get("files") != actual or not isinstance(doc.get("digest"), str):
        log.warning("ignoring %s: it describes %s, the checkpoint has %s", WEIGHTS_DIGEST_FILE, doc.get("files"), actual)
        return None
    return doc["digest"]


def artifact_config(cfg: EngineConfig, threads: int | None = None) -> dict:
    """Everything besides versions, device and weights that the compiled code depends on;
    `threads`: the worker's torch threads (default: what `cfg` gives torch, threads.graph_threads)."""
    conf = {"engine": cfg.compile_signature(), "aot_format": aot.FORMAT}
    if torch.device(cfg.device).type == "cpu":
        conf["cpu"] = cpu_code_target(threads or graph_threads(cfg))
    return conf


def cpu_code_target(threads: int) -> dict:
    """The instruction set compiled CPU code may use: the CPU profile (its -march) and the
    vector ISA and flags Inductor builds with here, which may add to the profile what this CPU
    has (-mavx512bf16 on Zen 4), so that an artifact never lands on a CPU without them; and the
    threads the graphs run on, which their guards hold (a graph compiled for 2 threads refuses a
    worker of 4: NoMatchingGraph at the first request). Two machines of one profile, the same such
    flags and the same threads share artifacts, whatever else they differ in."""
    from torch._inductor import cpu_vec_isa

    plat = platform.current()
    isa = cpu_vec_isa.pick_vec_isa()
    return {"profile": plat.profile.name, "march": plat.profile.march, "vec_isa": str(isa),
            "vec_flags": isa.build_arch_flags() if isa else "", "threads": threads}


def artifact_key(cfg: EngineConfig, weights: str, threads: int | None = None) -> CacheKey:
    """The key of what a worker with `cfg` runs here (`auto` resolved for this CPU) on `threads`
    (artifact_config's default)."""
    return current_key(weights, artifact_config(platform.resolve(cfg)[0], threads), cfg.device)


def write_key_file(key: CacheKey, path: Path) -> None:
    """The key as the sidecar reads it (CacheKey.describe() JSON)."""
    write_atomic(path, json.dumps(key.describe(), indent=1, sort_keys=True) + "\n")


# ---- lookup -----------------------------------------------------------------------------------

def check_dir(path: Path, key: CacheKey) -> Checked:
    """Is `path` a complete, untampered artifact for `key`? Hashes every file."""
    return check_artifact(path, key, hashes=True)


@dataclass(frozen=True)
class ArtifactPlaces:
    cache_dir: Path | None = None  # restored by the sidecar; a cold compile installs its artifact here
    bundled_dir: Path | None = None  # packed into the .mar by archive.sh --aot
    # A shelf of artifacts, one per key (handler.cache.shelf): cache_dir is then shelf/<key> (for_key)
    shelf: Path | None = None
    shelf_limit_bytes: int = 0

    def search(self) -> list[Path]:
        return [p for p in (self.cache_dir, self.bundled_dir) if p is not None]

    def for_key(self, key: CacheKey) -> ArtifactPlaces:
        """The places of `key`'s artifact: on a shelf, its own folder there."""
        return self if self.shelf is None else replace(self, cache_dir=shelf.key_dir(self.shelf, key.digest()))

    def used(self, path: Path) -> None:
        """`path` was loaded or installed: on a shelf, it is the most recently used, and the least
        recently used others go until the shelf fits its bound."""
        if self.shelf is not None and path == self.cache_dir:
            shelf.touch(path)
            shelf.evict(self.shelf, self.shelf_limit_bytes, keep=path)


def check_layout(places: ArtifactPlaces) -> None:
    """Refuse Inductor's own cache inside the artifact dir: installing an artifact replaces that
    dir wholesale, and any file the manifest does not list fails verification."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    where = places.shelf or places.cache_dir
    if where is None:
        return
    art, inductor = where.resolve(), Path(cache_dir()).resolve()
    if inductor == art or art in inductor.parents:
        raise ValueError(f"TORCHINDUCTOR_CACHE_DIR {inductor} is inside the compile artifact dir {art}; "
                         "give them separate directories (e.g. <volume>/aot and <volume>/inductor)")


def log_check(checked: Checked, key: CacheKey, on_rejected: Callable[[], None] | None) -> None:
    if checked.verdict == Verdict.REJECTED:
        log.error("compile artifacts REJECTED at %s: %s; not loaded", checked.path, checked.detail)
        if on_rejected is not None:
            on_rejected()
    elif checked.verdict == Verdict.OTHER_KEY:
        # Not loaded either (another CPU target, torch, config or weights), and counted: on a
        # mixed fleet a steady count says a profile's artifact is missing from the store.
        log.warning("compile artifacts at %s REFUSED: built for another key (%s); this worker needs %s",
                    checked.path, checked.detail, key.digest())
        if on_rejected is not None:
            on_rejected()


@contextmanager
def holding(places: ArtifactPlaces) -> Iterator[None]:
    """Hold the cache dir's install lock (the one the sidecar's restore takes) from lookup to
    install: files cannot be swapped between verification and load, and workers starting
    together compile once: the others wait, then load what the first installed."""
    with install_lock(places.cache_dir) if places.cache_dir is not None else nullcontext():
        yield


# ---- installing -------------------------------------------------------------------------------

def install(write: Callable[[Path], object], key: CacheKey, dest_dir: Path) -> None:
    """Let `write` fill a staging dir, add the manifest for `key`, then rename it to dest_dir:
    the layout of a restore from the store, so the sidecar can publish it, and a reader never
    sees a half-written artifact. Call it holding the lock (see `holding`)."""
    clear_leftovers(dest_dir)
    with staging_dir(dest_dir) as staged:
        write(staged)
        manifest = build_manifest(staged, key.describe())
        (staged / MANIFEST_NAME).write_bytes(manifest.to_json())
        replace_dir(staged, dest_dir)

