"""The CPU kernels of kernels.c, built once per process with Inductor's C++ toolchain.

Inductor's flags follow the platform's CPU profile (its -march), so the kernels are AVX2 code on an
AVX2 machine and AVX-512 where the profile allows it; the build (~1 s) lands in Inductor's kernel
cache, keyed by source and flags, and is reused from there."""
from __future__ import annotations

import ctypes
import functools
from pathlib import Path

SOURCE = Path(__file__).with_name("kernels.c")


class KernelBuildError(RuntimeError):
    """The quantized kernels could not be built (no C compiler?); the message has the compiler's."""


@functools.cache
def quantized_linear() -> ctypes._CFuncPtr:
    """ts_llm_quantized_linear(bits, x, q, d, m, y, M, N, K, G, threads); see kernels.c."""
    from torch._inductor.codecache import CppCodeCache

    from handler.engine import platform

    platform.current()  # applies the profile's -march before anything is compiled
    try:
        lib = CppCodeCache.load(SOURCE.read_text(), needs_vec_isa=True)  # the profile's vector ISA flags
    except Exception as err:  # Inductor raises its own CppCompileError (and OSError without a compiler)
        raise KernelBuildError(f"building the quantized kernels ({SOURCE.name}) failed: {err}") from err
    fn = lib.ts_llm_quantized_linear
    fn.restype = None
    ptr, i64 = ctypes.c_void_p, ctypes.c_int64
    fn.argtypes = [ctypes.c_int, ptr, ptr, ptr, ptr, ptr, i64, i64, i64, i64, ctypes.c_int]
    return fn
