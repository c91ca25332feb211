"""Real blocks of every k-quant and 5-bit format, as llama.cpp's `llama-quantize` writes them, for the
tests (tests/fixtures/gguf_blocks.gguf): 8 rows x 512 columns of one tensor per format, cut from
the 1B-class model's random weights (bench/peer_models.py: no model's weights) quantized to
Q4_K_M (Q4_K, Q6_K), Q5_K_M (Q5_K) and Q5_0 / Q5_1 with llama.cpp's own quantizer.

    .venv/bin/python -m bench.gguf_blocks
"""
from __future__ import annotations

import argparse
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import torch

from bench import peer_llamacpp as llamacpp
from bench.common import REPO
from handler.engine.quant.gguf_file import BLOCKS, read_directory, read_rows

OUT = REPO / "tests" / "fixtures" / "gguf_blocks.gguf"
SOURCE = "llama-1b-random.BF16.gguf"  # `python -m bench.peer --model 1b` makes it
QUANTIZE = {"Q4_K_M": ("Q4_K", "Q6_K"), "Q5_K_M": ("Q5_K",), "Q5_0": ("Q5_0",), "Q5_1": ("Q5_1",)}
ROWS, COLUMNS = 8, 512


def main() -> None:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    import gguf

    build = llamacpp.ensure_built(torch.get_num_threads())
    source = llamacpp.cache_root() / "gguf" / SOURCE
    writer = gguf.GGUFWriter(str(OUT), "llama")
    with tempfile.TemporaryDirectory() as tmp:
        for file_type, kinds in QUANTIZE.items():
            path = Path(tmp) / f"{file_type}.gguf"
            print(f"llama-quantize {SOURCE} -> {file_type}", flush=True)
            subprocess.run([build["binaries"]["llama-quantize"], str(source), str(path), file_type,
                            str(torch.get_num_threads())], check=True, capture_output=True)
            tensors = read_directory(path).tensors
            for kind in kinds:
                info = next(t for t in tensors.values() if t.kind == kind and t.shape[-1] >= COLUMNS)
                size, weights = BLOCKS[kind]
                raw = read_rows(path, info)[:ROWS, : COLUMNS // weights * size]
                writer.add_tensor(f"{kind}.{info.name}", np.ascontiguousarray(raw.numpy()),
                                  raw_dtype=gguf.GGMLQuantizationType[kind])
                print(f"  {kind}: {info.name} rows 0-{ROWS - 1}, columns 0-{COLUMNS - 1}", flush=True)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
