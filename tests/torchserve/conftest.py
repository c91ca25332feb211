from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.fake_torchserve import FakeManagement


@pytest.fixture
def management() -> Iterator[FakeManagement]:
    fake = FakeManagement()
    yield fake
    fake.close()
