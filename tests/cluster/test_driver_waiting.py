"""What the driver owes everyone waiting on it: each proposal, install and read is answered, even
when its entry is cut from the log, an install fails, or the node stops."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from app.cluster import log_store
from app.cluster.driver import RaftNode
from app.cluster.driver_errors import NotLeader, ProposalDropped
from app.cluster.log_store import LogStore
from app.raft.messages import AppendEntries, AppendResponse, Entry, Membership, VoteResponse
from app.state_machine import records
from app.state_machine.commands import Append, Code, CreateStream, encode_envelope
from app.state_machine.machine import COMPAT_BUCKET, StateMachine
from app.storage.kv import MemoryKV


async def _settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0.002)


def _append(body: bytes) -> bytes:
    return encode_envelope(1, Append(COMPAT_BUCKET, "s", "text/plain", memoryview(body)))


async def _leader_of_three(checkpoints: Any = None) -> RaftNode:
    """Node 1 of three, elected in term 1 by node 2 (nothing is sent anywhere), holding stream s."""

    async def send(messages: list[Any]) -> None:
        pass

    node = RaftNode(
        1,
        [1, 2, 3],
        LogStore(MemoryKV(log_store.COLUMN_FAMILIES)),
        StateMachine(MemoryKV(records.COLUMN_FAMILIES)),
        send=send,
        checkpoints=checkpoints,
        tick_seconds=3600,
        seed=1,
    )
    await node.start()
    node.core.campaign()
    node.receive(VoteResponse(1, 2, 1, True))
    await _settle()
    assert node.is_leader
    created = asyncio.create_task(
        node.propose(encode_envelope(1, CreateStream(COMPAT_BUCKET, "s", "text/plain", False)))
    )
    await _settle()
    node.receive(AppendResponse(1, 2, 1, True, node.core.log.last_index()))
    assert (await asyncio.wait_for(created, 5)).code is Code.CREATED
    return node


def test_proposals_whose_entries_were_cut_are_dropped_at_once_and_their_indexes_reused() -> None:
    async def scenario() -> None:
        node = await _leader_of_three()
        first = node.core.log.last_index()  # 2: the no-op, then the stream
        x, y, z = (asyncio.create_task(node.propose(_append(b))) for b in (b"x", b"y", b"z"))
        await _settle()
        assert node.core.log.last_index() == first + 3
        # Node 2 leads term 2 and replaces node 1's unreplicated tail with its own no-op.
        node.receive(AppendEntries(2, 2, 1, first, 1, [Entry(2, first + 1, b"")], first + 1))
        await _settle()
        assert node.core.log.last_index() == first + 1 and isinstance(x.exception(), ProposalDropped)
        assert isinstance(y.exception(), ProposalDropped) and isinstance(z.exception(), ProposalDropped)  # at once
        # Node 1 leads again in term 3; its new proposal lands where z's entry was.
        node.core.campaign()
        node.receive(VoteResponse(3, 3, 1, True))
        await _settle()
        w = asyncio.create_task(node.propose(_append(b"w")))
        await _settle()
        assert node.core.log.last_index() == first + 3
        node.receive(AppendResponse(3, 3, 1, True, node.core.log.last_index()))
        assert (await asyncio.wait_for(w, 5)).code is Code.APPENDED
        await node.stop()

    asyncio.run(scenario())


def test_stopping_answers_the_proposals_not_taken_yet() -> None:
    async def scenario() -> None:
        node = await _leader_of_three()
        node._wake.set = lambda: None  # type: ignore[method-assign]  # the driver never takes it
        queued = asyncio.create_task(node.propose(_append(b"q")))
        await _settle()
        assert node._proposals.queued and not queued.done()
        await node.stop()
        await _settle()
        assert isinstance(queued.exception(), ProposalDropped)

    asyncio.run(scenario())


def test_a_leader_handing_over_does_not_name_itself_as_the_leader() -> None:
    async def scenario() -> None:
        node = await _leader_of_three()
        node.receive(AppendResponse(1, 3, 1, True, node.core.log.last_index()))
        await _settle()
        assert node.core.transfer_leadership() in (2, 3)
        with pytest.raises(NotLeader) as caught:
            await asyncio.wait_for(node.propose(_append(b"t")), 5)
        assert caught.value.leader != node.id
        await node.stop()

    asyncio.run(scenario())


class FailingInstall:
    tried = 0

    async def send(self, peer: int, term: int) -> bool:
        return False

    def install(self) -> None:
        self.tried += 1
        raise OSError("the staged checkpoint cannot be read")


def test_an_install_that_fails_answers_its_caller() -> None:
    async def scenario() -> None:
        checkpoints = FailingInstall()
        node = await _leader_of_three(checkpoints)
        node.on_failure = lambda: None
        node.receive(AppendEntries(5, 2, 1, 100, 5, [], 100))  # a leader of term 5, far ahead
        await _settle()
        assert node.core.can_install_checkpoint(5, 100)
        installing = asyncio.create_task(node.install_checkpoint(5, 2, 100, 5))
        assert (await asyncio.wait_for(installing, 5)) is False
        assert checkpoints.tried == 1
        await node.stop()

    asyncio.run(scenario())


def test_read_contexts_differ_between_runs_of_a_node() -> None:
    firsts = set()
    for seed in range(5):
        node = RaftNode(
            1,
            [1, 2, 3],
            LogStore(MemoryKV(log_store.COLUMN_FAMILIES)),
            StateMachine(MemoryKV(records.COLUMN_FAMILIES)),
            seed=seed,
        )
        firsts.add(node._reads._ctx)
    assert len(firsts) == 5


def test_a_leader_that_removed_itself_answers_the_proposals_it_made_after() -> None:
    async def scenario() -> None:
        node = await _leader_of_three()
        node.receive(AppendResponse(1, 3, 1, True, node.core.log.last_index()))
        await _settle()
        removal = asyncio.create_task(node.change_membership(Membership({2: "http://n2", 3: "http://n3"})))
        await _settle()
        change = node.core.log.last_index()
        later = asyncio.create_task(node.propose(_append(b"after the change")))
        await _settle()
        assert node.core.log.last_index() == change + 1
        node.receive(AppendResponse(1, 2, 1, True, change))  # the change commits; what follows may not here
        await asyncio.wait_for(removal, 5)
        assert not node.is_leader
        assert isinstance(
            (await asyncio.wait_for(asyncio.gather(later, return_exceptions=True), 5))[0], ProposalDropped
        )
        await node.stop()

    asyncio.run(scenario())
