"""build_node: a node's parts made in order from its settings, started and stopped by the lifespan."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from app.config import Settings
from app.service.build import base_url, build_node, own_origins
from app.service.clock import ForwardClock
from app.state_machine.commands import Code, CreateStream
from app.state_machine.machine import COMPAT_BUCKET
from app.storage.kv import MemoryKV


def _memory(path: Path, column_families: list[str]) -> MemoryKV:
    return MemoryKV(column_families)


def test_a_single_node_is_built_without_a_running_loop_and_serves_once_started(tmp_path: Path) -> None:
    node = build_node(Settings(data_dir=tmp_path / "data"), open_kv=_memory)  # no event loop here
    assert node.transport is None and node.engine.node is node.raft and node.tiering.node is node.engine
    assert node.engine.webhooks is not None  # subscriptions are served from the start
    clock = node.engine.now_ms
    assert isinstance(clock, ForwardClock) and clock.floor() == node.machine.latest_now  # never behind the log

    async def scenario() -> None:
        await node.start()
        try:
            outcome = await node.engine.submit(CreateStream(COMPAT_BUCKET, "s", "text/plain", False))
            assert outcome.code is Code.CREATED
        finally:
            await node.stop()
            node.stop_pools()

    asyncio.run(scenario())


def test_a_cluster_member_gets_a_transport_that_starts_with_the_node(tmp_path: Path) -> None:
    peers = {1: "http://127.0.0.1:1", 2: "http://127.0.0.1:2"}
    node = build_node(Settings(data_dir=tmp_path / "data", node_id=1, peers=peers), open_kv=_memory)
    assert node.transport is not None and set(node.transport.peers) == {2}
    assert node.engine.clustered and node.engine.peers == peers


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ({"public_url": "https://streams.example/"}, "https://streams.example"),
        ({"node_id": 2, "peers": {1: "http://a:1", 2: "http://b:2/"}}, "http://b:2"),
        ({"host": "::1", "port": 9}, "http://[::1]:9"),
    ],
)
def test_the_base_url_is_configured_never_a_clients_host(settings: dict[str, object], expected: str) -> None:
    assert base_url(Settings(**settings)) == expected  # type: ignore[arg-type]


def test_the_nodes_own_origins_are_its_urls_and_loopback_names_at_its_port() -> None:
    single = own_origins(Settings(port=4437))
    assert {"http://127.0.0.1:4437", "http://localhost:4437", "http://[::1]:4437"} <= single
    public = own_origins(Settings(port=80, public_url="https://Rill.Example.com/base/"))
    assert "https://rill.example.com" in public and "http://localhost" in public  # default ports unnamed
    member = own_origins(Settings(node_id=2, peers={1: "http://10.0.0.1:4437", 2: "http://10.0.0.2:4438"}))
    assert "http://10.0.0.2:4438" in member and "http://10.0.0.1:4437" not in member
