"""The CPU kernels (quantized.c, amx.c, kquant.c, matvec.c, attention.c), their threads (pool.c) and
the ops' C++ entries (torch_op.cpp), built and loaded once per process with Inductor's C++
toolchain; loading registers the CPU kernels of ts_llm::quantized_linear, ts_llm::kquant_linear,
ts_llm::bf16_linear and ts_llm::attention (their schemas may be defined before or after).

Inductor's flags follow the platform's CPU profile (its -march), so the kernels are AVX2 code on an
AVX2 machine and AVX-512 where the profile allows it. The build (~3 s: the op's entry is written
against torch's stable ABI, whose headers are light) lands in Inductor's kernel cache, keyed by
source and flags, and is reused from there.

Within a process the last kernel library loaded registers the ops, whatever it was built for. So
before the engine runs a product, check_in_force asks the ops in force what they were built for
and refuses instructions beyond the platform's profile: a KernelMismatchError, never a SIGILL."""
from __future__ import annotations

import ctypes
import functools
import logging
import time
from pathlib import Path

import torch

from handler.engine import EngineError, cpu_profiles, platform

log = logging.getLogger(__name__)

SOURCES = tuple(Path(__file__).with_name(name)
                for name in ("pool.c", "quantized.c", "amx.c", "kquant.c", "matvec.c", "attention.c", "torch_op.cpp"))
POOL = SOURCES[0]  # the loops' threads: first, every kernel uses them
TARGETED = SOURCES[1:4]  # the quantized kernels: built with the CPU's extra targets
# The quantized kernels' paths beyond plain vectors (quantized_paths) and the GCC targets that give
# each: VNNI in its AVX-512 or its AVX encoding; AMX-INT8 tiles (the platform lists both together).
PATH_TARGETS = {"vnni": ("avx512vnni", "avxvnni"), "amx": ("amx-tile", "amx-int8")}
# What a build may execute beyond the architecture's baseline, as /proc/cpuinfo names the CPU flags:
# bit i of ts_llm_built_features() (quantized.c) is BUILT_FEATURES[i].
BUILT_FEATURES = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16",
                  "avx512_vnni", "avx_vnni", "amx_tile", "amx_int8", "sve", "bf16")

_lib = torch.library.Library("ts_llm", "FRAGMENT")
_lib.define("built_features(Tensor anchor) -> int")


class KernelBuildError(EngineError, RuntimeError):
    """The CPU kernels could not be built (no C compiler?); the message has the compiler's."""


class KernelMismatchError(EngineError, RuntimeError):
    """The ops in force run kernels built for instructions or paths this platform's profile does not
    have (a library built for another CPU was loaded into this process after ours)."""


def source(targets: tuple[str, ...]) -> str:
    """The kernels' translation unit; quantized.c, amx.c and kquant.c get `targets` (GCC target features
    the CPU has beyond the profile's -march, e.g. avx512vnni, amx-int8) and no other file does."""
    rest = (p.read_text() for p in SOURCES if p != POOL and p not in TARGETED)
    return "\n".join([quantized_source(targets), *rest])


def quantized_source(targets: tuple[str, ...]) -> str:
    """pool.c, then quantized.c, amx.c and kquant.c under `targets`: the part of source() that
    bench/kernels.py builds once per subset of the targets, to run every path side by side."""
    pool = POOL.read_text()
    text = "\n".join(p.read_text() for p in TARGETED)
    if not targets:
        return f"{pool}\n{text}"
    # g++ (Inductor compiles C++) does not define a pragma's feature macros (__AVX512VNNI__...) as
    # gcc does, so the kernels test macros of their own: TS_LLM_TARGET_AVX512VNNI, ..._AMX_INT8
    defines = "".join(f"#define {target_macro(t)} 1\n" for t in targets)
    # The intrinsics first, outside the pragma: included inside it they would be defined with its
    # targets, and matvec.c's calls after it (without them) could not inline them. That built only
    # where Inductor's own flags carried the same targets (AVX-512 VNNI, AMX), never for AVX-VNNI.
    return (f'{pool}\n#include <immintrin.h>\n#pragma GCC push_options\n#pragma GCC target("{",".join(targets)}")\n'
            f'{defines}{text}\n#pragma GCC pop_options\n')


def target_macro(target: str) -> str:
    """The macro the kernels test for a GCC target feature: avx512vnni -> TS_LLM_TARGET_AVX512VNNI."""
    return "TS_LLM_TARGET_" + target.upper().replace("-", "_")


@functools.cache
def load() -> ctypes.CDLL:
    """Build (or find in the cache) and load the kernels: from then on the ops run on CPU tensors
    (their wrappers and fakes call this; so does preparing a model whose graphs will)."""
    from torch._inductor.codecache import CppCodeCache

    plat = platform.current()  # applies the profile's -march before anything is compiled
    start = time.perf_counter()
    try:
        # needs_vec_isa: the profile's vector ISA flags
        library = CppCodeCache.load(source(plat.kernel_targets), needs_vec_isa=True)
    except Exception as err:  # Inductor raises its own CppCompileError (and OSError without a compiler)
        raise KernelBuildError(f"building the CPU kernels ({', '.join(p.name for p in SOURCES)}) failed: {err}") from err
    library.ts_llm_pool_solos.restype = ctypes.c_uint64  # ctypes keeps it: times_alone runs every step
    log.info("CPU kernels loaded in %.1f s; quantized products: %s", time.perf_counter() - start,
             ", ".join(quantized_paths(library)) or "plain vector instructions")
    check_in_force()
    return library


def loaded() -> bool:
    """Whether this process has loaded the kernels (load() ran)."""
    return load.cache_info().currsize > 0


def times_alone() -> int:
    """How often, since this process loaded the kernels, the pool's products went on on their
    caller alone because a worker thread stalled a loop (another process took its core): 0 while
    the cores are the engine's own, and under `threading: openmp`."""
    return load().ts_llm_pool_solos() if loaded() else 0


def check_in_force() -> None:
    """Raise KernelMismatchError unless the kernels the ops run now (those of the library loaded
    last) execute only what this platform's profile allows, and take the paths it targets."""
    from torch.utils._python_dispatch import _disable_current_modes

    plat = platform.current()
    with _disable_current_modes():  # load() may run in a traced op's fake: ask the real kernel
        built = built_features(torch.ops.ts_llm.built_features(torch.empty(0)))
    extras = {flag for flag, _ in plat.profile.kernel_extras if flag in plat.features}
    allowed = plat.profile.requires | extras
    beyond = [f for f in built if f not in allowed]
    paths, expected = paths_of(set(built)), paths_of(extras)
    if beyond or paths != expected:
        raise KernelMismatchError(
            f"the ts_llm ops in this process run kernels built for {', '.join(built) or 'the baseline'} "
            f"(paths: {', '.join(paths) or 'plain'}), but {plat.describe()} allows "
            f"{', '.join(sorted(allowed & set(BUILT_FEATURES))) or 'the baseline'} (paths: "
            f"{', '.join(expected) or 'plain'}){'; beyond it: ' + ', '.join(beyond) if beyond else ''}. "
            "A kernel library built for another CPU was loaded into this process after ours; "
            "start the worker in a fresh process")


def built_features(bits: int) -> tuple[str, ...]:
    """BUILT_FEATURES named by ts_llm_built_features()'s bits."""
    return tuple(name for i, name in enumerate(BUILT_FEATURES) if bits >> i & 1)


def paths_of(flags: set[str]) -> tuple[str, ...]:
    """The quantized kernels' paths that CPU flags (avx512_vnni, amx_int8...) give, as PATH_TARGETS names them."""
    targets = {target for p in cpu_profiles.PROFILES for flag, target in p.kernel_extras if flag in flags}
    return tuple(path for path, names in PATH_TARGETS.items() if targets & set(names))


def quantized_paths(library: ctypes.CDLL | None = None) -> tuple[str, ...]:
    """What the quantized kernels were built with beyond the profile's vectors: "vnni" (one-instruction
    int8 dot products), "amx" (AMX-INT8 tiles, from amx.c's row count up)."""
    bits = (library or load()).ts_llm_quantized_paths()
    return tuple(name for bit, name in ((1, "vnni"), (2, "amx")) if bits & bit)
