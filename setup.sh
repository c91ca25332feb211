#!/usr/bin/env bash
# Create .venv and install this package with its test extras (idempotent).
set -euo pipefail
cd "$(dirname "$0")"
python3.11 -m venv .venv 2>/dev/null || python3 -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
# torch first and exactly: a looser requirement resolved alone can pull a multi-GB CUDA build.
.venv/bin/python -m pip install --quiet "torch==2.13.0"
# setuptools reminds every editable install that a folder named like the package shadows it;
# here that folder is the package itself, so the reminder is noise
PYTHONWARNINGS="ignore:Editable installation" .venv/bin/python -m pip install --quiet -e ".[test]"
