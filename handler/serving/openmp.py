"""OpenMP's worker threads, released by a thread that is done with them, so that the thread that
steps the engine runs its parallel regions at full speed.

libgomp (torch's OpenMP on Linux) keeps a pool of worker threads for each thread that has run a
parallel region. When it manages more threads than there are CPUs, every pool's workers stop
spinning between parallel regions and sleep, and each region then starts with a futex wake. The
worker's main thread loads the model (a pool); in asyncCommunication mode the engine then steps in
a thread of its own (a second pool), and on 2 cores each default-model decode step took ~28 ms
instead of ~13 ms (a small compiled kernel: ~140 us a call instead of ~40 us). OpenMP 5.0's
omp_pause_resource_all(omp_pause_soft) frees the calling thread's pool (its next parallel region
would start a new one)."""
from __future__ import annotations

import ctypes
import logging
from pathlib import Path

import torch

log = logging.getLogger(__name__)

OMP_PAUSE_SOFT = 1


def release_this_threads_pool() -> bool:
    """Free the calling thread's OpenMP worker threads; False where torch's OpenMP is not libgomp
    (or not loaded), said in the log."""
    lib = _loaded_libgomp()
    if lib is None:
        log.info("torch's OpenMP is not libgomp here: the engine thread's OpenMP pool is left as it is")
        return False
    return lib.omp_pause_resource_all(OMP_PAUSE_SOFT) == 0


def _loaded_libgomp() -> ctypes.CDLL | None:
    """The libgomp this process has loaded (torch's own copy: loading another by name would get a
    second runtime with pools of its own)."""
    maps = Path("/proc/self/maps")
    if not maps.exists():
        return None
    paths = {line.split()[-1] for line in maps.read_text().splitlines() if "/libgomp" in line}
    torch_dir = str(Path(torch.__file__).parent)
    ours = sorted(paths, key=lambda path: not path.startswith(torch_dir))  # torch's own copy first
    return ctypes.CDLL(ours[0]) if ours else None
