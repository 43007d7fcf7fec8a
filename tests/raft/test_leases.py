"""The leader's lease: when it may answer a read without a round, and when it must not.

Each case is a way another node could be elected while the leader still counts on a round a
majority confirmed: a leadership transfer (its votes ignore leases), a voter that restarted (it
forgot it confirmed a round), and the bookkeeping of rounds on a leader that serves no reads.
"""

from __future__ import annotations

from app.raft.core import RaftCore
from app.raft.messages import AppendResponse, HardState, RequestVote, TimeoutNow, VoteResponse
from app.raft.ready import Role
from tests.raft.helpers import drain

ELECTION = 10


def _leader() -> RaftCore:
    core = RaftCore(1, [1, 2, 3], HardState(), [], election_ticks=ELECTION)
    core.campaign()
    core.step(VoteResponse(core.term, 2, 1, True))
    assert core.role is Role.LEADER
    drain(core)
    _round(core)
    return core


def _round(core: RaftCore) -> bool:
    """A heartbeat round both followers answer (they hold the whole log); True if the leader told a
    peer to campaign meanwhile."""
    core.tick()
    for peer in (2, 3):
        core.step(AppendResponse(core.term, peer, 1, True, core.log.last_index(), core.read_only.round))
    return any(isinstance(m, TimeoutNow) for m in drain(core).messages)


def _answered_at_once(core: RaftCore, ctx: int) -> bool:
    core.read_index(ctx)
    return (ctx, core.commit) in drain(core).reads


def test_a_leader_whose_majority_just_answered_reads_from_its_lease() -> None:
    assert _answered_at_once(_leader(), 1)


def test_a_leader_that_told_a_peer_to_campaign_reads_only_after_a_round() -> None:
    core = _leader()
    assert core.transfer_leadership() == 2
    assert any(isinstance(m, TimeoutNow) for m in drain(core).messages)
    told = core.clock
    # Node 2 never campaigns and the transfer stalls; until two election timeouts after the last
    # TimeoutNow it could still win with votes that ignore leases, so no read comes from the lease.
    ctx = 0
    while core.clock < told + 2 * ELECTION:
        ctx += 1
        assert not _answered_at_once(core, ctx), f"answered from the lease {core.clock - told} ticks after"
        if _round(core):
            told = core.clock
    assert core.role is Role.LEADER and core.transferee == 0
    _round(core)  # a round begun after that
    assert _answered_at_once(core, ctx + 1)


def test_a_voter_that_just_started_refuses_votes_for_an_election_timeout() -> None:
    # Before it stopped it may have answered a round that gave the leader its lease.
    core = RaftCore(2, [1, 2, 3], HardState(term=1), [], election_ticks=ELECTION)
    for tick in range(ELECTION):
        core.step(RequestVote(2, 3, 2, 0, 0, False, False))
        assert not [m for m in drain(core).messages if isinstance(m, VoteResponse)], f"a vote {tick} ticks in"
        core.tick()
    core.step(RequestVote(2, 3, 2, 0, 0, False, False))
    assert [(m.dst, m.granted) for m in drain(core).messages if isinstance(m, VoteResponse)] == [(3, True)]


def test_a_transfer_gets_the_vote_of_a_voter_that_just_started() -> None:
    core = RaftCore(2, [1, 2, 3], HardState(term=1), [], election_ticks=ELECTION)
    core.step(RequestVote(2, 3, 2, 0, 0, False, True))
    assert [(m.dst, m.granted) for m in drain(core).messages if isinstance(m, VoteResponse)] == [(3, True)]


def test_a_leader_without_reads_keeps_no_more_rounds_than_an_election_timeout() -> None:
    core = _leader()
    for _ in range(5_000):
        _round(core)
    assert core.read_only.round > 5_000 and len(core.read_only.round_ticks) <= ELECTION
    assert _answered_at_once(core, 1)
