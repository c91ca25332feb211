"""Record llama.cpp's tokens for a GGUF file: the fixture tests/packing/test_gguf_checkpoint.py holds
ours' tokenizer (converted from the file alone) to, so CI needs no llama.cpp.

    .venv/bin/python -m bench.gguf_tokens          # the default model's file -> tests/fixtures/

llama-server's /tokenize (add_special false, parse_special true: special tokens written in the
text are read as such, as in a chat template's output) on a fixed set of texts: special tokens,
whitespace runs, non-ASCII text, digits, code.
"""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import requests

from bench import peer_llamacpp as llamacpp
from bench.common import REPO
from handler.engine.convert import fetch_default_gguf
from handler.torchserve.launch import free_port

TEXTS = [
    "Hello world",
    "The capital of France is",
    "  leading spaces, trailing  ",
    "tabs\tand\nnewlines\n\n\nand   runs     of spaces",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>after an end",
    "café naïve résumé Ünïcödé",
    "東京は日本の首都です。",
    "Привет, как дела?",
    "emoji 🙂🚀 and symbols ©®™ ∑∫√",
    "numbers 1234567890 3.14159 -42 1e-9",
    "def f(x):\n    return x ** 2  # square\n",
    "{\"key\": [1, 2, {\"nested\": null}]}",
    "don't won't it's they're I'm",
    "URL: https://example.com/a?b=c&d=e#f",
]
FIXTURE = REPO / "tests" / "fixtures" / "llamacpp_tokens_default.json"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    build = llamacpp.ensure_built(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        gguf = fetch_default_gguf(Path(tmp))
        server = llamacpp.LlamaServer(build["binaries"]["llama-server"], gguf, free_port(), args.threads, 1, 512,
                                      Path(tmp) / "llama-server.log")
        try:
            server.wait_ready()
            tokens = {text: _tokenize(server.url, text) for text in TEXTS}
        finally:
            server.stop()
    FIXTURE.write_text(json.dumps({"gguf": gguf.name, "llama_cpp": build["version_line"], "sdist": build["sdist"],
                                   "add_special": False, "parse_special": True, "tokens": tokens},
                                  indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {FIXTURE.relative_to(REPO)} ({len(tokens)} texts)")


def _tokenize(url: str, text: str) -> list[int]:
    r = requests.post(f"{url}/tokenize", json={"content": text, "add_special": False, "parse_special": True}, timeout=30)
    r.raise_for_status()
    return r.json()["tokens"]


if __name__ == "__main__":
    main()
