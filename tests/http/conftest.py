from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.server import RillProcess


@pytest.fixture(scope="module")
def client(rill: RillProcess) -> Iterator[httpx.Client]:
    """Overrides the per-test `client`: same server, one connection pool per module (fast)."""
    with httpx.Client(base_url=rill.url, timeout=10) as c:
        yield c
