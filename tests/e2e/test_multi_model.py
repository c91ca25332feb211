"""Several models on one TorchServe keep their compiled artifacts side by side (the user's cache is
a shelf, one artifact per cache key): after a restart both are compiled at their first answer."""
from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
import requests

from handler.packing.archive import build_mar
from handler.packing.model_config import ServingOptions
from handler.torchserve.launch import Ports, start_torchserve

REPO = Path(__file__).resolve().parents[2]
MODELS = {"small": 64, "large": 96}  # max_seq_len: a different cache key each


def _store(tmp, checkpoint):
    store = tmp / "model_store"
    for name, seq in MODELS.items():
        handler = {"dtype": "float32", "compile": "inductor", "warm_start": "blocking", "max_seq_len": seq,
                   "max_batch_size": 2, "max_new_tokens_cap": 8, "default_max_new_tokens": 4, "served_model_name": name}
        build_mar(checkpoint, name, store, ServingOptions("continuous", batch_size=2, max_batch_delay_ms=10, handler=handler))
    return store


def _serve_once(store, workdir, ports) -> dict[str, str]:
    """Start TorchServe with both models, ask each once, stop; each model's engine mode at ready."""
    ts = start_torchserve(store, {name: f"{name}.mar" for name in MODELS}, REPO / "config.properties", workdir, ports)
    try:
        for name in MODELS:
            ts.wait_ready(name, timeout=900)
        for name in MODELS:
            requests.post(f"{ts.inference_url}/predictions/{name}", json={"prompt": "Hi", "max_new_tokens": 2},
                          headers=ts.headers(), timeout=120).raise_for_status()
        modes = re.findall(r"engine ready: .*, compile [0-9.]+ s \(([\w-]+)\)", ts.model_log())
    finally:
        ts.stop()
    return modes


@pytest.mark.timeout(1500)
def test_two_models_restarted_are_both_compiled_at_their_first_answer(tmp_path, tiny_checkpoint):
    store = _store(tmp_path, tiny_checkpoint)
    ports = Ports.free()
    assert sorted(_serve_once(store, tmp_path / "first", ports)) == ["aot-compiled", "aot-compiled"]
    time.sleep(1)
    assert _serve_once(store, tmp_path / "second", ports) == ["aot-loaded", "aot-loaded"]
