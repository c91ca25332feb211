"""Building the CPU kernels where no C compiler works: a KernelBuildError naming the kernels'
files (what docs/troubleshooting.md looks up), raised by build.load() itself."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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
    assert "KernelBuildError: building the CPU kernels (quantized.c, kquant.c, matvec.c, torch_op.cpp) failed" in run.stdout, \
        run.stdout + run.stderr


def test_extra_targets_apply_to_the_quantized_kernels_alone():
    from handler.engine.kernels import build

    source = build.source(("avx512vnni",))
    begin, end = source.index('#pragma GCC target("avx512vnni")'), source.index("#pragma GCC pop_options")
    assert "ts_llm_quantized_linear" in source[begin:end] and "ts_llm_bf16_linear(" not in source[begin:end]
    assert "#pragma GCC target" not in build.source(())
