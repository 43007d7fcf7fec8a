"""One in-process node per module: the real app and lifespan, its stores in memory (no RocksDB)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from tests.http.helpers import uid
from tests.inprocess import Node, running_node
from tests.protocol.helpers import LIMIT


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"  # the node's Raft driver and engine are asyncio code


@pytest.fixture(scope="module")
async def node(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Node]:
    async with running_node(tmp_path_factory.mktemp("inproc"), max_body_bytes=LIMIT, long_poll_timeout=0.2) as n:
        yield n


@pytest.fixture()
async def client(node: Node) -> AsyncIterator[httpx.AsyncClient]:
    """Overrides the session server's `client`: requests go straight to the in-process app."""
    async with httpx.AsyncClient(transport=httpx.ASGITransport(node.app), base_url="http://rill.test") as c:
        yield c


@pytest.fixture()
async def bucket(client: httpx.AsyncClient) -> str:
    """A fresh /ds bucket."""
    name = "b-" + uid()
    assert (await client.put(f"/ds/{name}")).status_code == 201
    return name
