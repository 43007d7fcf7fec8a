"""The driver's start and stop when something around them fails or is cancelled."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from app.cluster import log_store
from app.cluster.driver import RaftNode
from app.cluster.log_store import LogStore
from app.cluster.transport import Transport
from app.state_machine import records
from app.state_machine.commands import CreateStream, encode_envelope
from app.state_machine.machine import COMPAT_BUCKET, StateMachine
from app.storage.kv import MemoryKV
from app.storage.rocks import RocksKV


def test_a_driver_that_fails_replaying_fails_the_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A single node waits for its replay before serving; a driver that died in it (an I/O error in
    the apply) left that wait, and the process with it, spinning for good, deaf to SIGTERM."""

    async def run() -> None:
        raft_kv = RocksKV(tmp_path / "raft", log_store.COLUMN_FAMILIES)
        node = RaftNode(1, [1], LogStore(raft_kv), StateMachine(MemoryKV(records.COLUMN_FAMILIES)), seed=1)
        await node.start()
        await node.propose(encode_envelope(1, CreateStream(COMPAT_BUCKET, "s", "text/plain", False)))
        await node.stop()
        raft_kv.close()

        def broken(*args: object, **kwargs: object) -> None:
            raise OSError(5, "Input/output error")

        monkeypatch.setattr(StateMachine, "apply", broken)
        raft_kv = RocksKV(tmp_path / "raft", log_store.COLUMN_FAMILIES)
        node = RaftNode(1, [1], LogStore(raft_kv), StateMachine(MemoryKV(records.COLUMN_FAMILIES)), seed=1)
        with pytest.raises(OSError, match="Input/output error"):
            await asyncio.wait_for(node.start(), 5)
        await node.stop()
        raft_kv.close()

    asyncio.run(run())


class _Checkpoints:
    def install(self) -> None:
        pass

    async def send(self, peer: int, term: int) -> bool:
        return False


def _follower() -> RaftNode:
    machine = StateMachine(MemoryKV(records.COLUMN_FAMILIES))
    failed: list[str] = []
    node = RaftNode(1, [1, 2, 3], LogStore(MemoryKV(log_store.COLUMN_FAMILIES)), machine, checkpoints=_Checkpoints())  # type: ignore[arg-type]
    node.on_failure = lambda: failed.append("the driver died")
    return node


def test_a_checkpoint_whose_request_was_cancelled_does_not_kill_the_driver() -> None:
    """The request that staged a checkpoint is cancelled (the server's graceful stop ran out) before
    the driver installs it: answering its future raised InvalidStateError, which ended the driver."""

    async def run() -> None:
        node = _follower()
        await node.start()
        waiter = asyncio.create_task(node.install_checkpoint(term=5, leader=2, index=10, index_term=5))
        await asyncio.sleep(0)
        waiter.cancel()
        await asyncio.sleep(0.3)
        assert not node._tasks[0].done(), node._tasks[0].exception()
        assert node.core.applied == 10  # installed all the same: it was whole
        await node.stop()

    asyncio.run(run())


def test_a_stop_with_a_cancelled_checkpoint_request_waiting_stops() -> None:
    async def run() -> None:
        node = _follower()  # not started: the driver never got to the install
        waiter = asyncio.create_task(node.install_checkpoint(term=5, leader=2, index=10, index_term=5))
        await asyncio.sleep(0)
        waiter.cancel()
        await asyncio.sleep(0)
        await node.stop()  # raised InvalidStateError, and the node's stores were then never closed

    asyncio.run(run())


def test_closing_the_transport_does_not_swallow_a_cancel_of_its_caller() -> None:
    async def run() -> None:
        transport = Transport(1, {2: "http://127.0.0.1:1", 3: "http://127.0.0.1:2"}, b"secret")
        transport.start()
        await asyncio.sleep(0.01)
        after: list[str] = []

        async def stop() -> None:
            await transport.close()
            after.append("went on after its cancel")

        task = asyncio.create_task(stop())
        await asyncio.sleep(0)  # awaiting the senders now
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert after == []

    asyncio.run(run())
