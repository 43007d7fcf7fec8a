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
from app.service import engine as engine_module
from app.service.engine import Engine
from app.service.limits import Limits
from app.service.signals import Signals
from app.state_machine import records
from app.state_machine.commands import Append, AppendBatch, Code, CreateBucket, CreateStream, SetAttrs
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
            with pytest.raises(ProtocolError) as batch:  # an append-batch adds data as much as an append
                await engine.submit(AppendBatch("b", "s", None, [b"", b"z"]))
            assert (batch.value.status, batch.value.code) == (503, "cold_tier_backlog")
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


def test_a_write_on_a_node_that_knows_no_leader_waits_for_one(monkeypatch: pytest.MonkeyPatch) -> None:
    # A node just started, or mid-election, answered a write 503 no_leader at once; it now waits a
    # little for a leader to be known, then sends the write on.
    async def scenario() -> None:
        async with engine_on(FakeClock(), peers={1: "http://a", 2: "http://b"}) as engine:
            monkeypatch.setattr(RaftNode, "is_leader", property(lambda node: False))
            engine.node.core.leader = 0
            loop = asyncio.get_running_loop()
            loop.call_later(0.3, setattr, engine.node.core, "leader", 2)
            started = loop.time()
            assert await engine.led_elsewhere()
            assert 0.3 <= loop.time() - started < 1.0 and engine.leader_url() == "http://b"

    asyncio.run(scenario())


def test_the_expiry_sweep_removes_what_expired_and_looks_at_no_other_stream() -> None:
    clock = FakeClock()

    async def scenario() -> None:
        async with engine_on(clock) as engine:
            await engine.submit(CreateBucket("b"))
            for i in range(2_000):  # without TTL: never looked at
                await engine.submit(CreateStream("b", f"plain{i}", "text/plain", False))
            await engine.submit(CreateStream("b", "short", "text/plain", False, ttl=5))
            await engine.submit(CreateStream("b", "read", "text/plain", False, ttl=5))
            await engine.submit(CreateStream("b", "fresh", "text/plain", False, ttl=8))
            await engine.submit(CreateStream("b", "dated", "text/plain", False, expires_at=START_MS + 7_000))
            sid = {n: engine.machine.names[("b", n)] for n in ("short", "read", "fresh", "dated")}
            visited: list[int] = []
            engine.machine.table.streams = Counting(engine.machine.table.streams, visited)

            async def sweep_at(seconds: float) -> set[int]:
                clock.now = START_MS + int(seconds * 1000)
                visited.clear()
                await engine.collect_expired()
                return set(visited)

            def alive(name: str) -> bool:
                return engine.lookup("b", name) is not None

            clock.now = START_MS + 1_500
            engine.renew(engine.find("b", "fresh"))  # early in its TTL: renewed on the leader only
            await asyncio.sleep(0.05)
            assert engine.find("b", "fresh").touched_at == START_MS
            clock.now = START_MS + 4_000
            engine.renew(engine.find("b", "read"))  # a quarter of its TTL gone: the renewal is replicated
            await asyncio.sleep(0.05)
            assert engine.find("b", "read").touched_at == START_MS + 4_000

            assert await sweep_at(5.5) == {sid["short"], sid["read"]} and not alive("short") and alive("read")
            assert await sweep_at(7.5) == {sid["dated"]} and not alive("dated")
            assert await sweep_at(8.5) == {sid["fresh"]} and alive("fresh"), "the leader's own renewal counts"
            assert await sweep_at(9.5) == {sid["read"], sid["fresh"]} and not alive("read") and not alive("fresh")
            assert await sweep_at(60) == set() and engine.machine.upkeep.expiring == 0
            assert alive("plain0")

    asyncio.run(scenario())


def test_a_sweep_looks_at_no_more_expired_streams_than_it_collects(monkeypatch: pytest.MonkeyPatch) -> None:
    """Many streams expiring at once are collected a batch per sweep, each sweep looking at one batch:
    looking at all of them every time made the sweeps quadratic in their number."""
    clock = FakeClock()
    monkeypatch.setattr(engine_module, "COLLECT_AT_ONCE", 50)

    async def scenario() -> None:
        async with engine_on(clock) as engine:
            await engine.submit(CreateBucket("b"))
            for i in range(200):
                await engine.submit(CreateStream("b", f"s{i}", "text/plain", False, ttl=5))
            visited: list[int] = []
            engine.machine.table.streams = Counting(engine.machine.table.streams, visited)
            clock.now = START_MS + 6_000
            for left in (150, 100, 50, 0):
                visited.clear()
                await engine.collect_expired()
                assert len(set(visited)) <= 50 + 1
                assert sum(engine.lookup("b", f"s{i}") is not None for i in range(200)) == left

    asyncio.run(scenario())


def test_commands_born_of_reads_see_the_ttl_those_reads_renewed() -> None:
    """A read renews a sliding TTL on the leader at once and in the log a quarter-TTL later: the
    Touch a read proposes, a fork of the stream and a change to it must not take it for expired."""
    clock = FakeClock()

    async def scenario() -> None:
        async with engine_on(clock) as engine:
            await engine.submit(CreateBucket("b"))
            for name in ("read", "forked", "attrs"):
                await engine.submit(CreateStream("b", name, "text/plain", False, ttl=4))
            clock.now = START_MS + 600  # each read, renewed here only (under a quarter of the TTL)
            for name in ("read", "forked", "attrs"):
                engine.renew(engine.find("b", name))
            clock.now = START_MS + 4_300  # past the logged renewal's TTL, not past the local one
            engine.renew(engine.find("b", "read"))  # proposes a Touch
            await asyncio.sleep(0.05)
            fork = CreateStream("b", "copy", "text/plain", False, fork_stream="forked")
            fork.source_touched = engine.touched_at("b", "forked")
            assert (await engine.submit(fork)).code is Code.CREATED
            attrs = SetAttrs("b", "attrs", b'{"a":1}', engine.touched_at("b", "attrs"))
            assert (await engine.submit(attrs)).code is Code.OK
            for name in ("read", "forked", "attrs", "copy"):
                assert engine.lookup("b", name) is not None, name

    asyncio.run(scenario())


class Counting(dict[int, object]):
    """The table's streams, noting each sid looked up and refusing to be iterated."""

    def __init__(self, streams: dict[int, object], visited: list[int]) -> None:
        super().__init__(streams)
        self.visited = visited

    def get(self, sid: int, default: object = None) -> object:  # type: ignore[override]
        self.visited.append(sid)
        return super().get(sid, default)

    def values(self):  # type: ignore[override]
        raise AssertionError("the sweep iterated over every stream")


def test_a_key_two_publishes_upload_stays_protected_until_both_are_done() -> None:
    async def scenario() -> None:
        async with engine_on(FakeClock()) as engine:
            async with engine.uploading_key("b/s/snapshots/k.bin"):
                async with engine.uploading_key("b/s/snapshots/k.bin"):
                    pass  # one publish of the content finished (or was refused)
                assert "b/s/snapshots/k.bin" in engine.uploading  # the other still needs its object
            assert "b/s/snapshots/k.bin" not in engine.uploading and not engine.uploading

    asyncio.run(scenario())
