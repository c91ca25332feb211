"""A GGUF file alone as a checkpoint: everything comes from the file.

`archive.sh --checkpoint model.gguf` (or a directory holding one GGUF and no config.json) stages a
directory the worker loads like any other: the GGUF itself (weights, served as stored), and
config.json, tokenizer.json, tokenizer_config.json and the chat template, converted from the
file's metadata by transformers' GGUF integration (the maintained converter; not a hand-written
tokenizer). A tensor type the engine does not serve is refused here, with its name.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

from handler.engine.checkpoint import CheckpointError
from handler.engine.quant.gguf import SERVED_TYPES, GGUFWeights
from handler.packing.archive import link_or_copy

SHOWN = 5  # unserved tensors named in the error


def gguf_source(path: Path) -> Path | None:
    """The GGUF file `path` names: itself, or the only *.gguf of a directory without config.json;
    None for a checkpoint directory (config.json + safetensors, a GGUF beside or not)."""
    path = Path(path)
    if path.is_file() and path.suffix == ".gguf":
        return path
    if path.is_dir() and not (path / "config.json").exists():
        found = sorted(path.glob("*.gguf"))
        if len(found) > 1:
            raise CheckpointError(f"{path} holds {len(found)} GGUF files ({', '.join(f.name for f in found)}); "
                                  "give --checkpoint the one to serve")
        return found[0] if found else None
    return None


def stage_gguf(gguf: Path, dest: Path) -> Path:
    """dest/ with the GGUF (linked) and the config and tokenizer files converted from it."""
    check_served(gguf)
    config, tokenizer = _convert(gguf)
    dest.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(dest)
    tokenizer.save_pretrained(dest)
    link_or_copy(gguf, dest / gguf.name)
    return dest


def check_served(gguf: Path) -> None:
    unserved = GGUFWeights(gguf).unserved()
    if unserved:
        named = ", ".join(f"{t.name} ({t.kind})" for t in unserved[:SHOWN])
        more = f" and {len(unserved) - SHOWN} more" if len(unserved) > SHOWN else ""
        raise CheckpointError(f"{gguf.name} has tensors of a type the engine does not serve: {named}{more}; "
                              f"served: {', '.join(SERVED_TYPES)}")


def _convert(gguf: Path):
    """(config without its quantization_config, tokenizer) as transformers reads them from the file."""
    from transformers import AutoConfig, AutoTokenizer

    # A folder holding only the file: transformers also reads any tokenizer files beside it.
    with tempfile.TemporaryDirectory() as alone:
        os.symlink(gguf.resolve(), Path(alone) / gguf.name)
        try:
            config = AutoConfig.from_pretrained(alone, gguf_file=gguf.name)
            tokenizer = AutoTokenizer.from_pretrained(alone, gguf_file=gguf.name)
        except ValueError as err:  # an architecture or tokenizer transformers does not convert
            raise CheckpointError(f"{gguf.name}: {err}") from None
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    return config, tokenizer
