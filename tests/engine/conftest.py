"""Fixtures of the engine's tests on the real default model (a module with a tiny engine of its
own, as test_engine_batching.py, defines its own `engine`)."""
from __future__ import annotations

import pytest
import torch

from handler.engine.config import EngineConfig
from handler.engine.factory import build_engine


@pytest.fixture(scope="module")
def engine(default_checkpoint):
    """The engine on the float weights (quantization: none), as transformers reads them: eager, fp32."""
    cfg = EngineConfig(default_checkpoint, dtype="float32", compile="eager", max_batch_size=4, max_seq_len=256,
                       quantization="none")
    return build_engine(cfg).engine


@pytest.fixture(scope="module")
def reference(default_checkpoint):
    """transformers' model of the same checkpoint, fp32."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(default_checkpoint, dtype=torch.float32).eval()
