#!/usr/bin/env bash
# One command on a fresh machine: install, then run every test (unit, end-to-end against a real
# TorchServe, moto S3, the metadata emulator). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")"
./setup.sh
exec .venv/bin/python -m pytest "$@"
