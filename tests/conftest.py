"""Shared fixtures: the default model checkpoint, converted once per machine."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def artifacts_dir() -> Path:
    return Path(os.environ.get("TS_LLM_ARTIFACTS", REPO / "artifacts"))


@pytest.fixture(scope="session")
def default_checkpoint() -> Path:
    from handler.engine.convert import ensure_default_checkpoint

    return ensure_default_checkpoint(artifacts_dir() / "checkpoints" / "smollm2-135m-instruct")
