#!/usr/bin/env bash
# One command on a fresh machine: install, build the default model's .mar, serve it on loopback,
# and ask it one question. `./serve.sh --model-name NAME` serves model_store/NAME.mar as archive.sh
# built it (nothing is rebuilt); `./serve.sh --stop` stops the server; `--help` only prints the options.
set -euo pipefail
cd "$(dirname "$0")"
for arg in "$@"; do
  case "$arg" in
    -h|--help) exec python3 -m handler.serve --help ;;  # standard library only: nothing installed or built
  esac
done
if [ "${1:-}" = "--stop" ]; then exec .venv/bin/python -m handler.serve --stop; fi
./setup.sh
case " $* " in
  *" --model-name "* | *" --model-name="*) ;;  # an archive archive.sh built, served as it is
  *) ./archive.sh ;;
esac
exec .venv/bin/python -m handler.serve "$@"
