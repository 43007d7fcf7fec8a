"""The Engine on its own: a one-voter Raft node on in-memory stores, and a clock the test moves."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from app.cluster import log_store
from app.cluster.driver import RaftNode
from app.cluster.log_store import LogStore
from app.domain.errors import LeaderOnly, ProtocolError
from app.raft.messages import Membership
from app.service.engine import Engine
from app.service.limits import Limits
from app.service.signals import Signals
from app.state_machine import records
from app.state_machine.commands import Append, Code, CreateBucket, CreateStream
from app.state_machine.machine import StateMachine
from app.storage.kv import MemoryKV

START_MS = 1_800_000_000_000


class FakeClock:
    def __init__(self) -> None:
        self.now = START_MS

    def __call__(self) -> int:
        return self.now


@contextlib.asynccontextmanager
async def engine_on(clock: FakeClock, **options: object) -> AsyncIterator[Engine]:
    signals = Signals()
    machine = StateMachine(MemoryKV(records.COLUMN_FAMILIES), on_change=signals.notify)
    node = RaftNode(1, [1], LogStore(MemoryKV(log_store.COLUMN_FAMILIES)), machine, tick_seconds=0.01, seed=1)
    engine = Engine(node, machine, signals, Limits(read_chunk_bytes=4), clock=clock, **options)  # type: ignore[arg-type]
    await node.start()
    try:
        yield engine
    finally:
        await node.stop()


def test_a_write_goes_through_raft_and_reads_back_in_chunks() -> None:
    async def scenario() -> None:
        async with engine_on(FakeClock()) as engine:
            assert (await engine.submit(CreateBucket("b"))).code is Code.CREATED
            assert (await engine.submit(CreateStream("b", "s", "text/plain", False))).code is Code.CREATED
            for body in (b"hello ", b"world"):
                assert (await engine.submit(Append("b", "s", "text/plain", memoryview(body)))).code is Code.APPENDED
            meta = engine.find("b", "s")
            assert engine.bucket_exists("b") and engine.lookup("b", "s") is meta and engine.stream(meta.sid) is meta
            read, pos = b"", 0
            while pos < meta.tail:
                chunk = await engine.read(meta, pos)
                assert chunk.size <= 6  # at most read_chunk_bytes, but whole records
                read, pos = read + b"".join(chunk.payloads), chunk.next_pos
            assert read == b"hello world"
            assert (engine.counters.appends, engine.counters.appended_bytes) == (2, 11)

    asyncio.run(scenario())


def test_a_sliding_ttl_runs_on_the_engines_clock_and_a_read_renews_it() -> None:
    clock = FakeClock()

    async def scenario() -> None:
        async with engine_on(clock) as engine:
            await engine.submit(CreateBucket("b"))
            await engine.submit(CreateStream("b", "s", "text/plain", False, ttl=10))
            clock.now += 9_000
            engine.renew(engine.find("b", "s"))  # read at 9 s: alive until 19 s
            clock.now += 9_000
            assert engine.find("b", "s").name == "s"
            clock.now += 1_001
            with pytest.raises(ProtocolError) as gone:
                engine.find("b", "s")
            assert gone.value.status == 404

    asyncio.run(scenario())


def test_unknown_names_and_a_full_cold_backlog_are_refused_before_proposing() -> None:
    async def scenario() -> None:
        async with engine_on(FakeClock(), hot_backlog_budget=0) as engine:
            with pytest.raises(ProtocolError) as missing:
                engine.find("nope", "s")
            assert missing.value.status == 404
            await engine.submit(CreateBucket("b"))
            await engine.submit(CreateStream("b", "s", "text/plain", False))
            assert (await engine.submit(Append("b", "s", None, memoryview(b"x")))).code is Code.APPENDED
            applied = engine.machine.applied_index  # one byte waits for the object store: the budget is spent
            with pytest.raises(ProtocolError) as backlog:
                await engine.submit(Append("b", "s", None, memoryview(b"y")))
            assert (backlog.value.status, backlog.value.code) == (503, "cold_tier_backlog")
            assert engine.machine.applied_index == applied  # nothing reached the log

    asyncio.run(scenario())


def test_a_single_node_is_not_clustered_and_knows_its_members() -> None:
    async def scenario() -> None:
        async with engine_on(FakeClock()) as engine:
            assert not engine.clustered and engine.is_leader
            assert engine.peers == {1: ""}
            await engine.read_barrier()  # a no-op on one node
            engine.machine.membership = Membership({1: "http://a", 2: "http://b"})
            assert engine.peers == {1: "http://a", 2: "http://b"} and engine.clustered

    asyncio.run(scenario())


def test_a_ttl_stream_on_a_follower_is_served_by_the_leader(monkeypatch: pytest.MonkeyPatch) -> None:
    async def scenario() -> None:
        async with engine_on(FakeClock(), peers={1: "http://a", 2: "http://b"}) as engine:
            await engine.submit(CreateBucket("b"))
            await engine.submit(CreateStream("b", "s", "text/plain", False, ttl=10))
            assert engine.find("b", "s").ttl == 10  # the leader serves it
            monkeypatch.setattr(RaftNode, "is_leader", property(lambda node: False))
            with pytest.raises(LeaderOnly):
                engine.find("b", "s")

    asyncio.run(scenario())
