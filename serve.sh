#!/usr/bin/env bash
# One command on a fresh machine: install, build the default model's .mar, serve it on loopback,
# and answer a chat request. `./serve.sh --stop` stops the server.
set -euo pipefail
cd "$(dirname "$0")"
if [ "${1:-}" = "--stop" ]; then exec .venv/bin/python -m handler.serve --stop; fi
./setup.sh
./archive.sh
exec .venv/bin/python -m handler.serve
