"""One node in process: the real app and lifespan over ASGI, its Raft log and state machine in memory."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from asgi_lifespan import LifespanManager
from starlette.types import ASGIApp

from app.config import Settings
from app.server import create_app
from app.state_machine import records
from app.storage.kv import MemoryKV

Dump = dict[str, dict[str, list[tuple[bytes, bytes]]]]


@dataclass
class Node:
    """A single node's app, running its lifespan, with its Raft log and state machine in memory."""

    app: ASGIApp
    stores: dict[str, tuple[MemoryKV, list[str]]]  # by directory name ("raft", "state"): store, column families

    def dump(self) -> Dump:
        """Every pair of every column family of both stores."""
        return {name: {cf: list(kv.scan(cf, b"")) for cf in cfs} for name, (kv, cfs) in self.stores.items()}

    def state(self) -> list[tuple[str, bytes, bytes]]:
        """The state machine's pairs, but for the applied index (which every Raft entry moves)."""
        kv, cfs = self.stores["state"]
        return [
            (cf, k, v) for cf in cfs for k, v in kv.scan(cf, b"") if (cf, k) != (records.SM_META, records.APPLIED_KEY)
        ]

    @contextlib.contextmanager
    def unchanged(self) -> Iterator[None]:
        """Asserts that the block changed neither store: nothing was proposed to Raft, nothing applied."""
        before = self.dump()
        yield
        assert self.dump() == before, "a rejected request changed the stores"

    @contextlib.contextmanager
    def state_unchanged(self) -> Iterator[None]:
        """Asserts that the block changed no state: for commands that only the state machine can refuse,
        which reach it through the Raft log."""
        before = self.state()
        yield
        assert self.state() == before, "a rejected request changed the state"


@contextlib.asynccontextmanager
async def running_node(root: Path, **settings: Any) -> AsyncIterator[Node]:
    """A node with these settings, its data and cold store under `root` and its stores in memory."""
    stores: dict[str, tuple[MemoryKV, list[str]]] = {}

    def open_kv(path: Path, column_families: list[str]) -> MemoryKV:
        kv = MemoryKV(column_families)
        stores[path.name] = (kv, column_families)
        return kv

    settings = {
        "data_dir": root / "data",
        "cold_store": str(root / "cold"),
        "tiering_interval": 3600,  # no tiering pass while a test compares the stores before and after
        **settings,
    }
    threshold = gc.get_threshold()
    async with LifespanManager(create_app(Settings(**settings), open_kv=open_kv)) as manager:
        gc.set_threshold(*threshold)  # startup tunes and freezes the collector for a server process
        yield Node(manager.app, stores)
    gc.unfreeze()


@contextlib.asynccontextmanager
async def client_for(node: Node, timeout: float = 30) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(node.app)
    async with httpx.AsyncClient(transport=transport, base_url="http://rill.test", timeout=timeout) as client:
        yield client


@contextlib.asynccontextmanager
async def node_client(root: Path, **settings: Any) -> AsyncIterator[httpx.AsyncClient]:
    """A client of a fresh in-process node with these settings."""
    async with running_node(root, **settings) as node, client_for(node) as client:
        yield client
