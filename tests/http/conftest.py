from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.http.helpers import FAMILIES, family_base, uid
from tests.server import RillProcess


@pytest.fixture(scope="module")
def client(rill: RillProcess) -> Iterator[httpx.Client]:
    """Overrides the per-test `client`: same server, one connection pool per module (fast)."""
    with httpx.Client(base_url=rill.url, timeout=10) as c:
        yield c


@pytest.fixture(scope="module")
def ds_bucket(rill: RillProcess) -> str:
    """A /ds bucket for the module's streams (on the session's server)."""
    name = "proto-" + uid()
    assert httpx.put(f"{rill.url}/ds/{name}").status_code == 201
    return name


@pytest.fixture(params=FAMILIES)
def base(request: pytest.FixtureRequest, ds_bucket: str) -> str:
    """Each test that takes it runs once per route family: /ds/<bucket>/, /streams/, /v1/stream/."""
    return family_base(request.param, ds_bucket)


@pytest.fixture()
def path(base: str) -> str:
    """A fresh stream path (not yet created) in the family under test."""
    return f"{base}s-{uid()}"


@pytest.fixture(scope="module")
def bucket(client: httpx.Client) -> str:
    """A /ds bucket per module for the /ds sub-resource tests (test_ds_*.py); test_buckets.py has its own."""
    name = "ext-" + uid()
    assert client.put(f"/ds/{name}").status_code == 201
    return name
