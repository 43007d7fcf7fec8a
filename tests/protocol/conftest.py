"""One in-process node per module: the real app and lifespan, its stores in memory (no RocksDB)."""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from asgi_lifespan import LifespanManager

from app.config import Settings
from app.server import create_app
from app.storage.kv import MemoryKV
from tests.http.helpers import uid
from tests.protocol.helpers import LIMIT, Node


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"  # the node's Raft driver and engine are asyncio code


@pytest.fixture(scope="module")
async def node(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Node]:
    root = tmp_path_factory.mktemp("inproc")
    stores: dict[str, tuple[MemoryKV, list[str]]] = {}

    def open_kv(path: Path, column_families: list[str]) -> MemoryKV:
        kv = MemoryKV(column_families)
        stores[path.name] = (kv, column_families)
        return kv

    settings = Settings(
        data_dir=root / "data",
        cold_store=str(root / "cold"),
        max_body_bytes=LIMIT,
        long_poll_timeout=0.2,
        tiering_interval=3600,  # no tiering pass while a test compares the stores before and after
    )
    threshold = gc.get_threshold()
    async with LifespanManager(create_app(settings, open_kv=open_kv)) as manager:
        # Startup tunes and freezes the collector for a server process; not for the test process.
        gc.set_threshold(*threshold)
        yield Node(manager.app, stores)
    gc.unfreeze()


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
