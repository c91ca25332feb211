"""The CPU kernels (quantized.c, amx.c, kquant.c, matvec.c) and the ops' C++ entries (torch_op.cpp), built
and loaded once per process with Inductor's C++ toolchain; loading registers the CPU kernels of
ts_llm::quantized_linear, ts_llm::kquant_linear and ts_llm::bf16_linear (their schemas may be
defined before or after).

Inductor's flags follow the platform's CPU profile (its -march), so the kernels are AVX2 code on an
AVX2 machine and AVX-512 where the profile allows it. The build (~3 s: the op's entry is written
against torch's stable ABI, whose headers are light) lands in Inductor's kernel cache, keyed by
source and flags, and is reused from there."""
from __future__ import annotations

import ctypes
import functools
import logging
import time
from pathlib import Path

from handler.engine import EngineError

log = logging.getLogger(__name__)

SOURCES = tuple(Path(__file__).with_name(name)
                for name in ("quantized.c", "amx.c", "kquant.c", "matvec.c", "torch_op.cpp"))
TARGETED = SOURCES[:3]  # the quantized kernels: built with the CPU's extra targets
# The quantized kernels' paths beyond plain vectors (quantized_paths) and the GCC targets that give
# each: VNNI in its AVX-512 or its AVX encoding; AMX-INT8 tiles (the platform lists both together).
PATH_TARGETS = {"vnni": ("avx512vnni", "avxvnni"), "amx": ("amx-tile", "amx-int8")}


class KernelBuildError(EngineError, RuntimeError):
    """The CPU kernels could not be built (no C compiler?); the message has the compiler's."""


def source(targets: tuple[str, ...]) -> str:
    """The kernels' translation unit; quantized.c, amx.c and kquant.c get `targets` (GCC target features
    the CPU has beyond the profile's -march, e.g. avx512vnni, amx-int8) and no other file does."""
    return "\n".join([quantized_source(targets), *(p.read_text() for p in SOURCES if p not in TARGETED)])


def quantized_source(targets: tuple[str, ...]) -> str:
    """quantized.c, amx.c and kquant.c under `targets`: the part of source() that bench/kernels.py
    builds once per subset of the targets, to run every path side by side."""
    text = "\n".join(p.read_text() for p in TARGETED)
    if not targets:
        return text
    # g++ (Inductor compiles C++) does not define a pragma's feature macros (__AVX512VNNI__...) as
    # gcc does, so the kernels test macros of their own: TS_LLM_TARGET_AVX512VNNI, ..._AMX_INT8
    defines = "".join(f"#define {target_macro(t)} 1\n" for t in targets)
    # The intrinsics first, outside the pragma: included inside it they would be defined with its
    # targets, and matvec.c's calls after it (without them) could not inline them. That built only
    # where Inductor's own flags carried the same targets (AVX-512 VNNI, AMX), never for AVX-VNNI.
    return (f'#include <immintrin.h>\n#pragma GCC push_options\n#pragma GCC target("{",".join(targets)}")\n'
            f'{defines}{text}\n#pragma GCC pop_options\n')


def target_macro(target: str) -> str:
    """The macro the kernels test for a GCC target feature: avx512vnni -> TS_LLM_TARGET_AVX512VNNI."""
    return "TS_LLM_TARGET_" + target.upper().replace("-", "_")


@functools.cache
def load() -> ctypes.CDLL:
    """Build (or find in the cache) and load the kernels: from then on the ops run on CPU tensors
    (their wrappers and fakes call this; so does preparing a model whose graphs will)."""
    from torch._inductor.codecache import CppCodeCache

    from handler.engine import platform

    plat = platform.current()  # applies the profile's -march before anything is compiled
    start = time.perf_counter()
    try:
        # needs_vec_isa: the profile's vector ISA flags
        library = CppCodeCache.load(source(plat.kernel_targets), needs_vec_isa=True)
    except Exception as err:  # Inductor raises its own CppCompileError (and OSError without a compiler)
        raise KernelBuildError(f"building the CPU kernels ({', '.join(p.name for p in SOURCES)}) failed: {err}") from err
    log.info("CPU kernels loaded in %.1f s; quantized products: %s", time.perf_counter() - start,
             ", ".join(quantized_paths(library)) or "plain vector instructions")
    return library


def quantized_paths(library: ctypes.CDLL | None = None) -> tuple[str, ...]:
    """What the quantized kernels were built with beyond the profile's vectors: "vnni" (one-instruction
    int8 dot products), "amx" (AMX-INT8 tiles, from amx.c's row count up)."""
    bits = (library or load()).ts_llm_quantized_paths()
    return tuple(name for bit, name in ((1, "vnni"), (2, "amx")) if bits & bit)
