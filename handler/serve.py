"""`serve.sh`: start TorchServe with the built .mar on loopback, wait until the model is READY,
answer one chat request, and leave the server running (`serve.sh --stop` stops it)."""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import requests

from handler.engine import platform
from handler.engine.compiled.compile_progress import MARKER
from handler.engine.compiled.warm_start import SWITCHED
from handler.torchserve.errors import TorchServeError
from handler.torchserve.launch import TorchServe, ports_from, read_properties, start_torchserve
from handler.worker_log import MODEL_LOG

WORKDIR = Path("run")  # key_file.json, logs and TorchServe's pid file live here


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="serve.sh", description=__doc__)
    p.add_argument("--model-store", type=Path, default=Path("model_store"))
    p.add_argument("--model-name", default="llm")
    p.add_argument("--ts-config", type=Path, default=Path("config.properties"))
    p.add_argument("--ready-timeout", type=float, default=1800)
    p.add_argument("--stop", action="store_true", help="stop the server started by serve.sh")
    args = p.parse_args(argv)
    try:
        platform.detect()  # a TS_LLM_CPU_PROFILE this CPU cannot run: say so before starting anything
    except platform.PlatformError as err:
        print(f"serve.sh: error: {err}", file=sys.stderr)
        return 2
    ts = TorchServe(WORKDIR.resolve(), ports_from(read_properties(args.ts_config)))
    if args.stop:
        ts.stop()
        print("TorchServe stopped")
        return 0
    try:
        ts = start_torchserve(args.model_store, {args.model_name: f"{args.model_name}.mar"}, args.ts_config, WORKDIR.resolve())
        print(f"TorchServe starting; worker log: {WORKDIR}/{MODEL_LOG} (with no compiled artifact in the cache the model "
              "answers at eager speed at once while a process of its own compiles it; the log says when compiled "
              "steps take over)", flush=True)
        waited = ts.wait_ready(args.model_name, args.ready_timeout)
    except TorchServeError as err:
        print(f"serve.sh: error: {err}", file=sys.stderr)
        ts.stop()
        return 1
    print(f"model {args.model_name!r} READY after {waited:.0f} s")
    question = "What is the capital of France?"
    start = time.monotonic()
    r = requests.post(f"{ts.inference_url}/predictions/{args.model_name}/1.0/v1/chat/completions", headers=ts.headers(),
                      json={"model": args.model_name, "messages": [{"role": "user", "content": question}],
                            "max_tokens": 48, "temperature": 0}, timeout=120)
    r.raise_for_status()
    answer = r.json()["choices"][0]["message"]["content"]
    print(f"\nQ: {question}\nA: {answer}\n({time.monotonic() - start:.2f} s)\n")
    print(compile_status(ts.model_log()) + "\n")
    print(f"""The server keeps running on loopback. Try:
  TOKEN=$(python3 -c 'import json; print(json.load(open("{WORKDIR}/key_file.json"))["inference"]["key"])')
  curl -H "Authorization: Bearer $TOKEN" -H "Content-Type: application/json" \\
    {ts.inference_url}/predictions/{args.model_name} -d '{{"prompt": "Once upon a time", "stream": true}}'
OpenAI clients: base_url={ts.inference_url}/predictions/{args.model_name}/1.0/v1, api_key=$TOKEN
Metrics: {ts.metrics_url}/metrics    Stop: ./serve.sh --stop""")
    return 0


def compile_status(worker_log: str) -> str:
    """Where the compiled steps are, from the worker log: serving, or which graph is compiling."""
    if SWITCHED in worker_log:
        return "Compiled steps are serving."
    progress = [line[line.index(MARKER):] for line in worker_log.splitlines() if MARKER in line]
    if not progress:
        return "Serving eager steps (compile: see the worker log)."
    return (f"Serving eager steps while the compile runs: {progress[-1]}. "
            f"Follow it: grep 'aot:' {WORKDIR}/{MODEL_LOG}")


if __name__ == "__main__":
    sys.exit(main())
