"""A write on a node that knows no leader yet (just started, or mid-election), in process: it waits a
little for one and is then sent on, where it was answered 503 no_leader at once."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from app.cluster.driver import RaftNode
from app.raft.messages import Membership
from app.service.engine import Engine
from tests.inprocess import client_for, running_node

pytestmark = pytest.mark.anyio

TEXT = {"content-type": "text/plain"}


async def test_a_write_waits_for_a_leader_then_is_redirected_to_it(tmp_path: Path, monkeypatch) -> None:
    engines: list[Engine] = []
    made = Engine.__init__

    def kept(engine: Engine, *args: Any, **kwargs: Any) -> None:
        made(engine, *args, **kwargs)
        engines.append(engine)

    monkeypatch.setattr(Engine, "__init__", kept)
    async with running_node(tmp_path, forward_writes=False) as node, client_for(node) as client:
        assert (await client.put("/v1/stream/w", headers=TEXT)).status_code == 201
        (engine,) = engines
        engine.machine.membership = Membership({1: "http://a.test", 2: "http://b.test"})
        monkeypatch.setattr(RaftNode, "is_leader", property(lambda raft: False))
        engine.node.core.leader = 0  # a follower that has heard from no leader
        asyncio.get_running_loop().call_later(0.3, setattr, engine.node.core, "leader", 2)
        started = time.monotonic()
        sent = await client.post("/v1/stream/w", content=b"x", headers=TEXT)
        assert sent.status_code == 307 and sent.headers["location"] == "http://b.test/v1/stream/w", sent.text
        assert time.monotonic() - started >= 0.3
