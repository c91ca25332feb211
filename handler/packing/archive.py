"""Pack a checkpoint directory and the handler into model_store/<name>.mar with torch-model-archiver."""
from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path

import yaml
from model_archiver.model_archiver_config import ModelArchiverConfig
from model_archiver.model_packaging import generate_model_archive

from handler.engine.checkpoint import open_checkpoint
from handler.engine.compiled.artifacts import write_weights_digest
from handler.packing.model_config import ServingOptions, model_config
from handler.serving.config import CHECKPOINT_DIR_NAME, MODEL_CONFIG_FILE

log = logging.getLogger(__name__)

HANDLER_FILE = Path(__file__).resolve().parents[1] / "serving" / "llm_handler.py"
CHECKPOINT_FILES = ("*.safetensors", "*.json", "*.jinja")
GGUF_FILES = ("*.gguf",)  # packed where the handler may serve it (quantization: auto or gguf) or it is the only weights


def build_mar(checkpoint_dir: Path, model_name: str, model_store: Path, opts: ServingOptions,
              extra_dirs: dict[str, Path] | None = None, handler_file: Path = HANDLER_FILE) -> Path:
    """Write model_store/<model_name>.mar; `extra_dirs` maps folder names inside the archive to
    local folders (compiled artifacts, for instance)."""
    # fail here, with the reason, not in a worker later (the handler section itself is the worker's to parse)
    checkpoint = open_checkpoint(checkpoint_dir)
    model_store.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=model_store) as tmp:
        staging = Path(tmp) / "extra"
        staged_checkpoint = staging / opts.handler.get("checkpoint", CHECKPOINT_DIR_NAME)
        serves_gguf = opts.handler.get("quantization", "auto") in ("auto", "gguf") or checkpoint.gguf_only
        _stage(staged_checkpoint, checkpoint_dir, CHECKPOINT_FILES + (GGUF_FILES if serves_gguf else ()))
        # Hashed once here, so a worker's cache key needs no pass over the weights.
        write_weights_digest(open_checkpoint(staged_checkpoint), staged_checkpoint)
        for name, src in (extra_dirs or {}).items():
            _stage(staging / name, src, patterns=("**/*",))
        config_file = Path(tmp) / MODEL_CONFIG_FILE
        config_file.write_text(yaml.safe_dump(model_config(opts), sort_keys=False))
        generate_model_archive(ModelArchiverConfig(
            model_name=model_name, handler=str(handler_file), version="1.0", extra_files=str(staging),
            export_path=str(model_store), archive_format="zip-store", force=True, config_file=str(config_file),
        ))
    mar = model_store / f"{model_name}.mar"
    log.info("wrote %s (%.0f MB)", mar, mar.stat().st_size / 1e6)
    return mar


def _stage(dest: Path, src: Path, patterns: tuple[str, ...] = CHECKPOINT_FILES) -> None:
    # Hard links where possible: the archiver copies again, no need to copy twice.
    for pattern in patterns:
        for file in Path(src).glob(pattern):
            if file.is_file():
                target = dest / file.relative_to(src)
                target.parent.mkdir(parents=True, exist_ok=True)
                link_or_copy(file, target)


def link_or_copy(src: Path, dest: Path) -> None:
    """A hard link where the filesystem allows one, else a copy."""
    try:
        os.link(src, dest)
    except OSError:
        shutil.copy2(src, dest)
