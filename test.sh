#!/usr/bin/env bash
# One command on a fresh machine: install, lint and type-check (ruff, mypy; configured in
# pyproject.toml), then run every test (unit, end-to-end against a real TorchServe, moto S3, the
# metadata emulator). Extra arguments go to pytest.
# On a machine whose CPU profile is above avx2, the path of AVX2-only spot instances is tested again:
# the kernel, quantization and compiled-path tests on an emulated AVX2-only CPU (tests/emulated.sh:
# there an instruction beyond AVX2 is a SIGILL, as on Zen 3, whatever this host has), and the other
# engine and serving tests under the forced avx2 profile (TS_LLM_CPU_PROFILE=avx2).
set -euo pipefail
cd "$(dirname "$0")"
./setup.sh
.venv/bin/python -m ruff check handler bench tests
.venv/bin/python -m mypy handler bench
.venv/bin/python -m pytest "$@"
native=$(.venv/bin/python -m handler.engine.platform --name)
case "$native" in
  avx2 | x86_64 | aarch64*) echo "test.sh: CPU profile $native: no AVX2-only pass (avx2 is this machine's own path or above it)" ;;
  *)
    echo "test.sh: CPU profile $native: kernel, quantization and compiled-path tests again on an emulated AVX2-only CPU"
    tests/emulated.sh "$@"
    echo "test.sh: CPU profile $native: the other engine and serving tests again under the forced avx2 profile"
    (eval "$(TS_LLM_CPU_PROFILE=avx2 .venv/bin/python -m handler.engine.platform --exports)"
     exec .venv/bin/python -m pytest "$@" tests/engine tests/e2e/test_rest.py tests/e2e/test_openai.py \
       --ignore=tests/engine/kernels --ignore=tests/engine/quant --ignore=tests/engine/compiled) ;;
esac
