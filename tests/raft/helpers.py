"""Helpers shared by the Raft core tests."""

from __future__ import annotations

from collections.abc import Iterable

from app.raft.core import RaftCore
from app.raft.messages import AppendEntries, AppendResponse, HardState, Membership, Message, VoteResponse, encode
from app.raft.ready import Ready, Role


def drain(core: RaftCore) -> Ready:
    """Runs one Ready as a driver would: persist, then report it."""
    rd = core.ready()
    if rd.entries:
        core.on_persisted(rd.entries[-1].index, rd.entries[-1].term)
    if rd.committed:
        core.on_applied(rd.committed[-1].index)
    return rd


# Membership and checkpoint scenarios, stepped by hand (tests/raft/test_membership.py, test_checkpoints.py)


def cfg(voters: Iterable[int], learners: Iterable[int] = ()) -> Membership:
    """A configuration with a made-up URL per node."""
    return Membership({v: f"http://n{v}" for v in voters}, {n: f"http://n{n}" for n in learners})


def sent_to(rd: Ready, dst: int) -> list[Message]:
    return [m for m in rd.messages if m.dst == dst]


def appends_to(rd: Ready, dst: int) -> list[AppendEntries]:
    return [m for m in rd.messages if isinstance(m, AppendEntries) and m.dst == dst]


def elect(voters: Iterable[int] = (1, 2, 3), learners: Iterable[int] = (4,)) -> RaftCore:
    """Node 1 wins term 1 with node 2's vote; its no-op (index 1) is neither persisted nor committed."""
    core = RaftCore(1, list(voters), HardState(), [], learners=list(learners))
    core.campaign()
    core.step(VoteResponse(core.term, 2, 1, True))
    assert core.role is Role.LEADER and core.log.last_index() == 1
    return core


def ack(leader: RaftCore, src: int, match: int | None = None) -> None:
    """A successful AppendResponse from `src` (by default: it holds the leader's whole log)."""
    index = leader.log.last_index() if match is None else match
    leader.step(AppendResponse(leader.term, src, leader.id, True, index))


def ready_leader(voters: Iterable[int] = (1, 2, 3), learners: Iterable[int] = (4,)) -> RaftCore:
    """A leader whose no-op node 2 acked, so it is committed and applied: it may change membership."""
    leader = elect(voters, learners)
    drain(leader)
    ack(leader, 2)
    assert [e.index for e in drain(leader).committed] == [1]
    assert leader.applied == leader.pending_membership == 1
    return leader


def commit_membership(leader: RaftCore, new: Membership) -> tuple[int, Ready]:
    """Proposes `new`, has node 2 ack it, and drains the Ready that applies it."""
    index = leader.propose_membership(new, encode(new))
    assert index is not None
    drain(leader)
    ack(leader, 2)
    assert leader.commit >= index
    return index, drain(leader)
