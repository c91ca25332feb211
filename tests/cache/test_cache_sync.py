from __future__ import annotations

import logging
from pathlib import Path

import pytest

from handler.cache.key import CacheKey
from handler.cache.local import LocalStore
from handler.cache.sync import PublishOutcome, RestoreOutcome, publish_if_new, restore


def _lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith("handler.cache")]


def test_miss_is_one_line_and_no_exception(tmp_path: Path, key: CacheKey, caplog):
    with caplog.at_level(logging.INFO, logger="handler.cache"):
        assert restore(LocalStore(tmp_path / "store"), key, tmp_path / "dest") is RestoreOutcome.MISS
    assert len(_lines(caplog)) == 1
    assert "starting cold" in _lines(caplog)[0]


def test_publish_restore_already_local(tmp_path: Path, artifact: Path, key: CacheKey, caplog):
    store = LocalStore(tmp_path / "store")
    assert publish_if_new(store, key, artifact) is PublishOutcome.PUBLISHED
    for expected in (RestoreOutcome.RESTORED, RestoreOutcome.ALREADY_LOCAL):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="handler.cache"):
            assert restore(store, key, tmp_path / "dest") is expected
        assert len(_lines(caplog)) == 1, _lines(caplog)


def test_empty_source_is_a_caller_bug(tmp_path: Path, key: CacheKey):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no files to publish"):
        publish_if_new(LocalStore(tmp_path / "store"), key, tmp_path / "empty")


def test_outcomes_are_plain_strings():
    assert RestoreOutcome.STORE_UNAVAILABLE == "store_unavailable"
    assert PublishOutcome.ALREADY_PRESENT == "already_present"
