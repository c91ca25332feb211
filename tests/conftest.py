"""Shared fixtures: the default model checkpoint, converted once per machine."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session", autouse=True)
def private_user_cache(tmp_path_factory: pytest.TempPathFactory):
    """The handler's default compile cache is the user's cache directory: tests (and the
    TorchServe workers they start, which inherit this environment) get a private one."""
    old = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("xdg-cache"))
    yield
    if old is None:
        os.environ.pop("XDG_CACHE_HOME", None)
    else:
        os.environ["XDG_CACHE_HOME"] = old


def artifacts_dir() -> Path:
    return Path(os.environ.get("TS_LLM_ARTIFACTS", REPO / "artifacts"))


@pytest.fixture(scope="session")
def default_checkpoint() -> Path:
    from handler.engine.convert import ensure_default_checkpoint

    return ensure_default_checkpoint(artifacts_dir() / "checkpoints" / "smollm2-135m-instruct")
