"""The .mar's cache key (what the sidecar restores by) is the key its worker computes."""
import zipfile

import yaml

from handler.engine.checkpoint import open_checkpoint
from handler.engine.compiled.artifacts import artifact_key, weights_digest
from handler.packing.archive import build_mar
from handler.packing.model_config import ServingOptions
from handler.packing.precompile import key_for_mar
from handler.serving.config import MODEL_CONFIG_FILE, HandlerConfig


def test_the_mar_key_is_the_workers_with_quantization_auto_and_a_gguf(tmp_path, default_checkpoint):
    assert next(default_checkpoint.glob("*.gguf"), None) is not None, "the default checkpoint carries its GGUF"
    mar = build_mar(default_checkpoint, "llm", tmp_path / "store", ServingOptions(handler={"quantization": "auto"}))
    model_dir = tmp_path / "model_dir"
    zipfile.ZipFile(mar).extractall(model_dir)
    model_yaml = yaml.safe_load((model_dir / MODEL_CONFIG_FILE).read_text())
    cfg = HandlerConfig.from_model_yaml(model_yaml, model_dir, environ={}).engine
    assert key_for_mar(mar) == artifact_key(cfg, weights_digest(open_checkpoint(cfg.checkpoint_dir)))
