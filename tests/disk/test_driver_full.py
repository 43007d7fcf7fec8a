"""The Raft driver when a store runs out of space: 507s, no exit, nothing acknowledged lost, and writes
again once the store takes them (in memory: stores that fail their writes on demand)."""

from __future__ import annotations

import asyncio

import pytest

from app.cluster import driver, log_store
from app.cluster.driver import RaftNode
from app.cluster.log_store import LogStore
from app.domain.errors import ProtocolError
from app.raft.messages import AppendEntries, Entry
from app.state_machine import records
from app.state_machine.commands import Append, Code, CreateStream, Outcome, encode_envelope
from app.state_machine.machine import COMPAT_BUCKET, StateMachine
from app.storage.kv import Batch, MemoryKV

ENOSPC = "IO error: No space left on device: While appending to file: raft/000004.log: No space left on device"


class FillableKV(MemoryKV):
    """Writes fail as RocksDB's do on a full disk while `full`, or with `error` when set."""

    def __init__(self, column_families: list[str]) -> None:
        super().__init__(column_families)
        self.full = False
        self.sync_full = False  # the write goes in, its sync fails: fsync can fail so on a full disk
        self.error: Exception | None = None

    def write(self, batch: Batch, sync: bool = False) -> None:
        if self.error is not None:
            raise self.error
        if self.full:
            raise Exception(ENOSPC)
        super().write(batch, sync)

    def sync_wal(self) -> None:
        if self.sync_full:
            raise Exception(ENOSPC)
        super().sync_wal()

    def recover(self) -> bool:
        return not (self.full or self.sync_full)


class Node:
    def __init__(self) -> None:
        self.raft_kv = FillableKV(log_store.COLUMN_FAMILIES)
        self.state_kv = FillableKV(records.COLUMN_FAMILIES)
        self.machine = StateMachine(self.state_kv)
        self.failed = False
        on_failure = lambda: setattr(self, "failed", True)  # noqa: E731
        self.node = RaftNode(1, [1], LogStore(self.raft_kv), self.machine, seed=1, on_failure=on_failure)

    async def append(self, body: bytes) -> Outcome:
        command = Append(COMPAT_BUCKET, "s", "text/plain", memoryview(body))
        return await self.node.propose(encode_envelope(1, command))

    def content(self) -> bytes:
        meta = self.machine.lookup(COMPAT_BUCKET, "s")
        assert meta is not None
        return b"".join(self.machine.read(meta, 0, 1 << 30).payloads)


async def _started() -> Node:
    n = Node()
    await n.node.start()
    await n.node.propose(encode_envelope(1, CreateStream(COMPAT_BUCKET, "s", "text/plain", False)))
    for body in (b"a", b"b"):
        assert (await n.append(body)).code is Code.APPENDED
    return n


async def _until_writable(n: Node, body: bytes) -> Outcome:
    for _ in range(500):
        try:
            return await n.append(body)
        except ProtocolError as exc:
            assert exc.status == 507
            await asyncio.sleep(0.01)
    raise AssertionError("the node never took writes again")


@pytest.fixture(autouse=True)
def quick_recovery(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(driver, "RECOVER_SECONDS", 0.01)


def test_a_full_log_fails_the_write_with_507_and_writes_resume_once_freed() -> None:
    async def scenario() -> None:
        n = await _started()
        n.raft_kv.full = True
        with pytest.raises(ProtocolError) as caught:
            await n.append(b"lost")
        assert (caught.value.status, caught.value.code) == (507, "insufficient_storage")
        with pytest.raises(ProtocolError):
            await n.append(b"refused")  # while stalled, at once
        assert n.content() == b"ab"  # reads go on
        await asyncio.sleep(0.05)
        assert not n.failed
        n.raft_kv.full = False
        assert (await _until_writable(n, b"c")).code is Code.APPENDED
        assert n.content() == b"abc"  # the failed write is gone for good: a single node drops its entry
        await n.node.stop()
        assert not n.failed

    asyncio.run(scenario())


def test_a_full_state_store_holds_the_committed_write_until_it_applies() -> None:
    async def scenario() -> None:
        n = await _started()
        n.state_kv.full = True
        pending = asyncio.create_task(n.append(b"c"))  # its entry is in the log: it commits, apply fails
        for _ in range(200):
            if n.node._full:
                break
            await asyncio.sleep(0.005)
        assert n.node._full
        with pytest.raises(ProtocolError):
            await n.append(b"refused")
        assert n.content() == b"ab"  # reloaded from the store: the half-done apply is not visible
        assert not pending.done()
        n.state_kv.full = False
        assert (await asyncio.wait_for(pending, 5)).code is Code.APPENDED
        assert n.content() == b"abc"
        assert (await n.append(b"d")).code is Code.APPENDED
        assert n.content() == b"abcd"
        await n.node.stop()
        assert not n.failed

    asyncio.run(scenario())


def test_any_other_store_failure_still_stops_the_node() -> None:
    async def scenario() -> None:
        n = await _started()
        n.raft_kv.error = Exception("IO error: Corruption: block checksum mismatch")
        proposal = asyncio.create_task(n.append(b"c"))
        for _ in range(200):
            if n.failed:
                break
            await asyncio.sleep(0.005)
        assert n.failed
        proposal.cancel()
        await n.node.stop()  # collects the driver's error

    asyncio.run(scenario())


def test_a_write_whose_sync_failed_is_not_applied_after_its_507() -> None:
    async def scenario() -> None:
        n = await _started()
        n.raft_kv.sync_full = True
        with pytest.raises(ProtocolError) as caught:
            await n.append(b"lost")  # in the store's memory, never synced
        assert caught.value.status == 507
        n.raft_kv.sync_full = False
        assert (await _until_writable(n, b"c")).code is Code.APPENDED  # the client's retry
        assert n.content() == b"abc"  # not b"ablostc": the 507 said it was not acknowledged
        await n.node.stop()
        assert not n.failed

    asyncio.run(scenario())


def test_messages_that_come_while_the_disk_is_full_are_not_kept() -> None:
    async def scenario() -> None:
        n = await _started()
        n.raft_kv.full = True
        with pytest.raises(ProtocolError):
            await n.append(b"lost")
        entry = Entry(5, 10, b"x" * 1000)
        for _ in range(1000):  # a leader's appends keep coming; Raft sends them again later
            n.node.receive(AppendEntries(5, 2, 1, 9, 5, [entry], 9))
            n.node.receive_all([AppendEntries(5, 2, 1, 9, 5, [entry], 9)])
        assert n.node._inbox == []
        n.raft_kv.full = False
        assert (await _until_writable(n, b"c")).code is Code.APPENDED
        await n.node.stop()

    asyncio.run(scenario())
