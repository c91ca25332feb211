"""open_store: the one reader of a store URI (the sidecar's cache_store, archive.sh --aot-store)."""

from __future__ import annotations

from pathlib import Path

import pytest

from handler.cache.errors import StoreUriError
from handler.cache.local import LocalStore
from handler.cache.s3 import S3Store
from handler.cache.uri import open_store


def test_s3_uri_names_bucket_and_prefix() -> None:
    store = open_store("s3://bucket/some/prefix", "http://127.0.0.1:9", "us-east-1")
    assert isinstance(store, S3Store)
    assert (store.bucket, store.prefix) == ("bucket", "some/prefix")


def test_s3_uri_without_a_bucket_is_refused_before_any_request() -> None:
    with pytest.raises(StoreUriError, match=r"cache store 's3:///p' has no bucket"):
        open_store("s3:///p")


@pytest.mark.parametrize("prefix", ["", "file://"])
def test_anything_else_is_a_local_directory(tmp_path: Path, prefix: str) -> None:
    store = open_store(prefix + str(tmp_path / "store"))
    assert isinstance(store, LocalStore) and store.root == tmp_path / "store"
