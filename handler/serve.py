"""`serve.sh`: start TorchServe with a built .mar on loopback, wait until the model is READY,
answer one question, and leave the server running (`serve.sh --stop` stops it).

Only the standard library is imported before the arguments are read, so `serve.sh --help` runs on
a bare python3, before anything is installed or built."""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

WORKDIR = Path("run")  # key_file.json, logs and TorchServe's pid file live here
QUESTION = "What is the capital of France?"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="serve.sh", description="Install, build the default model's .mar (unless --model-name names one "
        "archive.sh built), serve it on loopback and ask it one question.")
    p.add_argument("--model-store", type=Path, default=Path("model_store"))
    p.add_argument("--model-name", default="llm",
                   help="serve MODEL_STORE/NAME.mar as archive.sh built it (./archive.sh --checkpoint DIR --model-name "
                        "NAME); the default, llm, is the embedded SmolLM2-135M-Instruct, built on first use")
    p.add_argument("--ts-config", type=Path, default=Path("config.properties"))
    p.add_argument("--ready-timeout", type=float, default=1800)
    p.add_argument("--stop", action="store_true", help="stop the server started by serve.sh")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from handler.engine import platform
    from handler.torchserve.errors import TorchServeError
    from handler.torchserve.launch import TorchServe, ports_from, read_properties, start_torchserve
    from handler.worker_log import MODEL_LOG

    try:
        platform.detect()  # a TS_LLM_CPU_PROFILE this CPU cannot run: say so before starting anything
    except platform.PlatformError as err:
        return _error(str(err), 2)
    ts = TorchServe(WORKDIR.resolve(), ports_from(read_properties(args.ts_config)))
    if args.stop:
        ts.stop()
        print("TorchServe stopped")
        return 0
    mar = args.model_store / f"{args.model_name}.mar"
    if not mar.is_file():
        return _error(f"{mar} not found: build it first (./archive.sh --checkpoint DIR --model-name {args.model_name})", 2)
    try:
        ts = start_torchserve(args.model_store, {args.model_name: mar.name}, args.ts_config, WORKDIR.resolve())
        print(f"TorchServe starting; worker log: {WORKDIR}/{MODEL_LOG} (with no compiled artifact in the cache the model "
              "answers at eager speed at once while a process of its own compiles it; the log says when compiled "
              "steps take over)", flush=True)
        waited = ts.wait_ready(args.model_name, args.ready_timeout)
    except TorchServeError as err:
        ts.stop()
        return _error(str(err), 1)
    print(f"model {args.model_name!r} READY after {waited:.0f} s")
    base = f"{ts.inference_url}/predictions/{args.model_name}/1.0/v1"
    start = time.monotonic()
    try:
        answer = ask(base, ts.headers(), args.model_name, QUESTION)
    except DemoError as err:
        return _error(f"the server answered {err} (it keeps running; ./serve.sh --stop stops it)", 1)
    print(f"\nQ: {QUESTION}\nA: {answer}\n({time.monotonic() - start:.2f} s)\n")
    print(compile_status(ts.model_log()) + "\n")
    print(f"""The server keeps running on loopback. Try:
  TOKEN=$(python3 -c 'import json; print(json.load(open("{WORKDIR}/key_file.json"))["inference"]["key"])')
  curl -H "Authorization: Bearer $TOKEN" -H "Content-Type: application/json" \\
    {ts.inference_url}/predictions/{args.model_name} -d '{{"prompt": "Once upon a time", "stream": true}}'
OpenAI clients: base_url={base}, api_key=$TOKEN
Metrics: {ts.metrics_url}/metrics    Stop: ./serve.sh --stop""")
    return 0


class DemoError(Exception):
    """The server refused the demo's request: its status and message."""


def ask(base: str, headers: dict, model: str, question: str) -> str:
    """The model's greedy answer to `question`: through its chat template, or as a plain prompt on
    the completions route when the model has none (a base model)."""
    import requests

    from handler.engine.tokenizer import NO_CHAT_TEMPLATE

    body: dict[str, Any] = {"model": model, "max_tokens": 48, "temperature": 0}
    r = requests.post(f"{base}/chat/completions", headers=headers, timeout=120,
                      json={**body, "messages": [{"role": "user", "content": question}]})
    if r.status_code == 400 and _message(r).startswith(NO_CHAT_TEMPLATE):
        print(f"({NO_CHAT_TEMPLATE}: asking on the completions route)")
        # a base model continues text: the question as the start of a question-and-answer
        r = requests.post(f"{base}/completions", headers=headers, timeout=120,
                          json={**body, "prompt": f"Q: {question}\nA:"})
        return _first_choice(r)["text"]
    return _first_choice(r)["message"]["content"]


def _first_choice(r) -> dict:
    """The response's first choice; DemoError with the server's status and message when it refused."""
    if not r.ok:
        raise DemoError(f"{r.status_code}: {_message(r)}")
    return r.json()["choices"][0]


def _message(r) -> str:
    """An error response's message ({"error": {"message": ...}}), else its text."""
    try:
        return str(r.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return r.text.strip()


def _error(message: str, status: int) -> int:
    print(f"serve.sh: error: {message}", file=sys.stderr)
    return status


def compile_status(worker_log: str) -> str:
    """Where the compiled steps are, from the worker log: serving, or which graph is compiling."""
    from handler.engine.compiled.compile_progress import MARKER
    from handler.engine.compiled.warm_start import SWITCHED
    from handler.worker_log import MODEL_LOG

    if SWITCHED in worker_log:
        return "Compiled steps are serving."
    progress = [line[line.index(MARKER):] for line in worker_log.splitlines() if MARKER in line]
    if not progress:
        return "Serving eager steps (compile: see the worker log)."
    return (f"Serving eager steps while the compile runs: {progress[-1]}. "
            f"Follow it: grep 'aot:' {WORKDIR}/{MODEL_LOG}")


if __name__ == "__main__":
    sys.exit(main())
