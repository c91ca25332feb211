"""A real TorchServe serving a real .mar of the default model, token auth on, started once."""
from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from handler.packing.archive import build_mar
from handler.packing.model_config import ServingOptions
from handler.torchserve.launch import Ports, start_torchserve

REPO = Path(__file__).resolve().parents[2]
MODEL = "llm"
MAX_SEQ_LEN = 256
CAP = 64
# The compiled server's cold compile (~15 min on 2 cores: three graphs, 260-320 s each) runs in the
# setup of the first test that asks for `server`, inside that test's time limit.
COMPILED_SERVER_TIMEOUT_S = 1500


def pytest_collection_modifyitems(items):
    for item in items:
        if "server" in getattr(item, "fixturenames", ()) and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(COMPILED_SERVER_TIMEOUT_S))


def build_store(tmp: Path, checkpoint: Path, batching: str, compile_mode: str) -> Path:
    handler = {"dtype": "bfloat16", "compile": compile_mode, "max_seq_len": MAX_SEQ_LEN, "max_new_tokens_cap": CAP,
               "default_max_new_tokens": 16, "served_model_name": MODEL}
    store = tmp / "model_store"
    build_mar(checkpoint, MODEL, store, ServingOptions(batching, batch_size=8, max_batch_delay_ms=10, handler=handler))
    return store


def running_server(tmp: Path, checkpoint: Path, batching: str, compile_mode: str, ready_timeout: float):
    """Build a .mar, start TorchServe on free ports, yield it once READY (and, compiled, once
    serving compiled steps), always stop it."""
    store = build_store(tmp, checkpoint, batching, compile_mode)
    ts = start_torchserve(store, {MODEL: f"{MODEL}.mar"}, REPO / "config.properties", tmp / "work", Ports.free())
    try:
        start = time.monotonic()
        ts.wait_ready(MODEL, timeout=ready_timeout)
        if compile_mode == "inductor":  # ready at once; compiled once the compile process is done
            ts.wait_compiled(MODEL, start + ready_timeout)
        yield ts
    finally:
        ts.stop()


@pytest.fixture(scope="session")
def server(tmp_path_factory, default_checkpoint):
    """Continuous batching, compiled engine: the product's default shape."""
    yield from running_server(tmp_path_factory.mktemp("ts_continuous"), default_checkpoint, "continuous", "inductor", 1200)


@pytest.fixture(scope="session")
def no_template_server(tmp_path_factory, default_checkpoint):
    """The default model with its chat template removed (a base model's shape), eager."""
    tmp = tmp_path_factory.mktemp("ts_no_template")
    checkpoint = tmp / "checkpoint"
    shutil.copytree(default_checkpoint, checkpoint, ignore=shutil.ignore_patterns("chat_template.jinja"))
    config = json.loads((checkpoint / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (checkpoint / "tokenizer_config.json").write_text(json.dumps(config))
    yield from running_server(tmp, checkpoint, "dynamic", "eager", 300)


@pytest.fixture(scope="session")
def dynamic_server(tmp_path_factory, default_checkpoint):
    """batchSize/maxBatchDelay mode, eager: token-by-token gRPC streaming lives here."""
    yield from running_server(tmp_path_factory.mktemp("ts_dynamic"), default_checkpoint, "dynamic", "eager", 300)


@pytest.fixture(scope="session")
def async_server(tmp_path_factory, default_checkpoint):
    """asyncCommunication mode, eager: the worker's own engine loop."""
    yield from running_server(tmp_path_factory.mktemp("ts_async"), default_checkpoint, "async", "eager", 300)


@pytest.fixture(scope="session")
def grpc_stubs(tmp_path_factory):
    from bench.grpc_stubs import load_inference_stubs

    return load_inference_stubs(tmp_path_factory.mktemp("grpc"))
