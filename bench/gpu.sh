#!/usr/bin/env bash
# The engine benchmark on a CUDA GPU, in a few minutes: run on a machine with a GPU.
#   bash bench/gpu.sh
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || ./setup.sh
.venv/bin/python -m bench.engine --device cuda --batches 1 8 32 --new-tokens 128 --variants eager compiled --out engine_gpu
