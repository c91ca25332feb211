"""The launcher gives up on a worker that cannot load, instead of waiting out its timeout."""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from handler.packing.archive import build_mar
from handler.packing.model_config import ServingOptions
from handler.torchserve.errors import TorchServeError
from handler.torchserve.launch import Ports, start_torchserve

REPO = Path(__file__).resolve().parents[2]
MODEL = "llm"



@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_crash_looping_worker_fails_wait_ready_with_its_error(tmp_path, default_checkpoint):
    handler = {"compile": "eager", "no_such_key": 1}  # the .mar builds; the worker's load refuses it
    store = tmp_path / "model_store"
    build_mar(default_checkpoint, MODEL, store, ServingOptions("continuous", batch_size=4, max_batch_delay_ms=10, handler=handler))
    ts = start_torchserve(store, {MODEL: f"{MODEL}.mar"}, REPO / "config.properties", tmp_path / "work", Ports.free())
    try:
        start = time.monotonic()
        with pytest.raises(TorchServeError, match=r"died 3 times while loading; first error: .*unknown key 'no_such_key'"):
            ts.wait_ready(MODEL, timeout=200)
        assert time.monotonic() - start < 120, "the crash loop is noticed long before the timeout"
    finally:
        ts.stop()
