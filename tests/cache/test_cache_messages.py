"""The cache's error messages name settings that exist: the sidecar's flags and config keys."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from handler.sidecar.config import SidecarConfig

CACHE = Path(__file__).resolve().parents[2] / "handler" / "cache"
FLAGS = {"--" + f.name.replace("_", "-") for f in dataclasses.fields(SidecarConfig)}
KEYS = {f.name for f in dataclasses.fields(SidecarConfig)}


@pytest.mark.parametrize("module", ["s3.py", "local.py"])
def test_messages_name_real_flags_and_keys(module: str) -> None:
    text = (CACHE / module).read_text()
    assert not re.search(r"cache\.(s3_\w+|local_dir)", text), "settings that do not exist"
    flags = set(re.findall(r"--[a-z][a-z-]+", text))
    assert flags, "the messages should say which flag to change"
    assert flags <= FLAGS, flags - FLAGS
    # `(key)` after a flag: the config-file spelling of the same setting.
    for flag, key in re.findall(r"(--[a-z][a-z-]+)[^(\n]*\((\w+)\)", text):
        assert key in KEYS and flag == "--" + key.replace("_", "-"), (flag, key)
