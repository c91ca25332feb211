"""Building the CPU kernels where no C compiler works: a KernelBuildError naming the kernels'
files (what docs/troubleshooting.md looks up), raised by build.load() itself."""
from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]

LOAD = """
from handler.engine.kernels import build
try:
    build.load()
except build.KernelBuildError as err:
    print("KernelBuildError:", err)
"""


def test_a_missing_compiler_is_a_kernel_build_error(tmp_path):
    # a fresh Inductor cache (nothing built to find) and a compiler that is not there
    env = {**os.environ, "CXX": str(tmp_path / "no-such-c++"), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    run = subprocess.run([sys.executable, "-c", LOAD], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    names = "pool.c, quantized.c, amx.c, kquant.c, matvec.c, attention.c, torch_op.cpp"
    assert f"KernelBuildError: building the CPU kernels ({names}) failed" in run.stdout, \
        run.stdout + run.stderr


def test_extra_targets_apply_to_the_quantized_kernels_alone():
    from handler.engine.kernels import build

    source = build.source(("avx512vnni", "amx-int8"))
    begin, end = source.index('#pragma GCC target("avx512vnni,amx-int8")'), source.index("#pragma GCC pop_options")
    region = source[begin:end]
    assert "ts_llm_quantized_linear" in region and "tiles_linear(" in region and "ts_llm_bf16_linear(" not in region
    assert "#define TS_LLM_TARGET_AVX512VNNI 1" in region and "#define TS_LLM_TARGET_AMX_INT8 1" in region
    assert "#pragma GCC target" not in build.source(()) and "#define TS_LLM_TARGET" not in build.source(())


def test_the_quantized_kernels_take_every_path_the_platform_targets():
    # g++ takes a target pragma's instructions without defining its feature macros (__AVX512VNNI__),
    # so code that tested those compiled the slower path silently; the build reports what it has
    from handler.engine import platform
    from handler.engine.kernels import build

    targets = platform.current().kernel_targets
    assert build.quantized_paths() == tuple(path for path, names in build.PATH_TARGETS.items()
                                            if set(names) & set(targets))


# Kernels built for targets this CPU may lack are built and loaded only in a child process under the
# forced avx2 profile (whose flags carry neither AVX-512 nor VNNI): loading a library registers its
# kernels as the process's ops, so in this process the next quantized product would run them (SIGILL
# on a CPU without AVX-VNNI). The child runs no product.
AVX_VNNI_BUILD = """
from torch._inductor.codecache import CppCodeCache
from handler.engine.kernels import build
build.load()
library = CppCodeCache.load(build.source(("avxvnni",)), needs_vec_isa=True)
print("paths:", build.quantized_paths(library))
try:
    build.check_in_force()
except build.KernelMismatchError as err:
    print("KernelMismatchError:", err)
"""


def test_the_quantized_kernels_build_on_their_own():
    # bench/kernels.py builds them once per path, without the other files; they once lacked the
    # pool's threads (pool.c) and did not compile. No ops are registered: torch_op.cpp is not in it.
    from torch._inductor.codecache import CppCodeCache

    from handler.engine import platform
    from handler.engine.kernels import build

    library = CppCodeCache.load(build.quantized_source(platform.current().kernel_targets), needs_vec_isa=True)
    assert build.quantized_paths(library) == build.quantized_paths()


@functools.cache
def avx_vnni_build_under_avx2() -> str:
    """What AVX_VNNI_BUILD printed, run in a child process under the forced avx2 profile."""
    from handler.engine import cpu_profiles

    env = {**os.environ, **cpu_profiles.BY_NAME["avx2"].environment()}
    run = subprocess.run([sys.executable, "-c", AVX_VNNI_BUILD], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="AVX-VNNI is x86")
def test_the_kernels_build_with_avx_vnni_under_avx2_flags():
    # the intrinsics were once included inside the target pragma, and matvec.c's calls after it then
    # failed to inline unless Inductor's own flags carried the same targets, which they do for
    # AVX-512 VNNI and never for AVX-VNNI (as on Zen 3 and in test.sh's forced avx2 pass)
    assert "paths: ('vnni',)" in avx_vnni_build_under_avx2()


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="AVX-VNNI is x86")
def test_kernels_loaded_after_ours_for_another_cpu_are_refused_before_they_run():
    out = avx_vnni_build_under_avx2()
    assert "KernelMismatchError: the ts_llm ops in this process run kernels built for avx2, fma, f16c, avx_vnni " \
           "(paths: vnni), but CPU profile avx2 (forced" in out, out
    assert "(paths: plain); beyond it: avx_vnni." in out, out


def test_the_kernels_in_force_are_the_platforms_own():
    from handler.engine.kernels import build

    build.load()
    build.check_in_force()  # raises KernelMismatchError otherwise



@pytest.mark.skipif(os.uname().machine != "x86_64", reason="AMX is x86")
def test_the_kernels_compile_with_amx_tiles(tmp_path):
    # compiled only, never loaded (this CPU may lack AVX-512): the tile path is built only where a CPU
    # has AMX, so a declaration lost from quantized.c showed on no other machine
    import torch

    from handler.engine.kernels import build

    source = tmp_path / "kernels.cpp"
    source.write_text(build.source(("avx512vnni", "amx-tile", "amx-int8")))
    include = Path(torch.__file__).parent / "include"
    run = subprocess.run([shutil.which("g++") or "g++", "-std=c++17", "-march=skylake-avx512", "-fopenmp", "-fsyntax-only",
                          "-Wall", "-Werror", f"-I{include}", str(source)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
