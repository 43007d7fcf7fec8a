"""Peer messages the core refuses before they change anything (app/raft/validate.py)."""

from __future__ import annotations

import pytest

from app.raft import validate
from app.raft.core import RaftCore
from app.raft.messages import (
    MEMBERSHIP,
    AppendEntries,
    AppendResponse,
    Entry,
    HardState,
    Membership,
    Message,
    VoteResponse,
    encode,
)


def _follower() -> RaftCore:
    """Node 2, following leader 1 in term 3, with entries 1..4 (terms 1, 1, 2, 3) committed up to 3."""
    entries = [Entry(1, 1, b"a"), Entry(1, 2, b"b"), Entry(2, 3, b"c"), Entry(3, 4, b"d")]
    core = RaftCore(2, [1, 2, 3], HardState(term=3, vote=1, commit=3), entries, applied=3)
    core.step(AppendEntries(3, 1, 2, 4, 3, [], 3))
    core.ready()
    return core


def _state(core: RaftCore) -> tuple[object, ...]:
    return (core.term, core.vote, core.commit, core.leader, core.role, list(core.log.entries))


def _refused(core: RaftCore, msg: Message) -> str:
    before = _state(core)
    core.step(msg)
    rd = core.ready()
    assert _state(core) == before, "a refused message changed the node's state"
    assert not rd.messages and not rd.entries
    assert len(rd.refused) == 1 and rd.refused[0][0] == msg.src
    return rd.refused[0][1]


def test_an_entry_that_would_overwrite_a_committed_one_is_refused_not_asserted() -> None:
    core = _follower()
    forged = AppendEntries(3, 1, 2, 1, 1, [Entry(3, 2, b"forged")], 4)
    assert _refused(core, forged) == validate.OVERWRITES_COMMITTED
    # From a higher term too: the term is not taken either.
    assert _refused(core, AppendEntries(9, 1, 2, 1, 1, [Entry(9, 2, b"x")], 4)) == validate.OVERWRITES_COMMITTED


def test_an_uncommitted_entry_may_still_be_replaced() -> None:
    core = _follower()
    core.step(AppendEntries(4, 3, 2, 3, 2, [Entry(4, 4, b"new")], 3))
    rd = core.ready()
    assert not rd.refused and [e.data for e in rd.entries] == [b"new"]


@pytest.mark.parametrize(
    ("msg", "reason"),
    [
        (AppendEntries(3, 1, 2, 4, 3, [Entry(3, 6, b"gap")], 3), validate.ENTRIES_OUT_OF_ORDER),
        (AppendEntries(3, 1, 2, 4, 3, [Entry(3, 5, b""), Entry(3, 5, b"")], 3), validate.ENTRIES_OUT_OF_ORDER),
        (AppendEntries(3, 1, 2, 4, 3, [Entry(7, 5, b"ahead")], 3), validate.ENTRY_TERM_AHEAD),
        (AppendEntries(3, 1, 2, 4, 3, [Entry(3, 5, b""), Entry(2, 6, b"")], 3), validate.ENTRY_TERM_AHEAD),
        (AppendEntries(3, 1, 2, 4, 5, [], 3), validate.ENTRY_TERM_AHEAD),
        (AppendEntries(3, 1, 2, 4, 3, [Entry(3, 5, b"\xff", MEMBERSHIP)], 3), validate.BAD_ENTRY),
        (AppendEntries(3, 1, 2, 4, 3, [Entry(3, 5, b"", 7)], 3), validate.BAD_ENTRY),
        (AppendEntries(3, 1, 2, -1, 3, [], 3), validate.NEGATIVE),
        (AppendEntries(3, 1, 3, 4, 3, [], 3), validate.MISADDRESSED),
        (AppendEntries(3, 2, 2, 4, 3, [], 3), validate.MISADDRESSED),
    ],
)
def test_impossible_appends_are_refused_whole(msg: AppendEntries, reason: str) -> None:
    assert _refused(_follower(), msg) == reason


def test_a_valid_membership_entry_passes() -> None:
    core = _follower()
    data = encode(Membership({1: "http://a", 2: "http://b", 3: "http://c"}))
    core.step(AppendEntries(3, 1, 2, 4, 3, [Entry(3, 5, data, MEMBERSHIP)], 3))
    assert not core.ready().refused


def test_a_message_from_a_past_term_is_answered_and_counted() -> None:
    core = _follower()
    core.step(AppendEntries(2, 3, 2, 3, 2, [], 3))
    rd = core.ready()
    assert rd.refused == [(3, validate.STALE_TERM)]
    assert [type(m) for m in rd.messages] == [AppendResponse]  # Raft's refusal, so the stale leader steps down
    assert core.term == 3 and core.leader == 1


def test_a_leader_refuses_an_acknowledgement_past_its_log() -> None:
    core = RaftCore(1, [1, 2, 3], HardState(), [])
    core.campaign()
    for peer in (2, 3):
        core.step(_vote(core, peer))
    core.ready()
    last = core.log.last_index()
    before = core.commit
    core.step(AppendResponse(core.term, 2, 1, True, last + 1_000_000))
    rd = core.ready()
    assert rd.refused == [(2, validate.MATCH_BEYOND_LOG)]
    assert core.commit == before and core.tracker.progress[2].match <= last


def _vote(core: RaftCore, peer: int) -> Message:
    return VoteResponse(core.term, peer, 1, True, pre_vote=core.role.value == "pre-candidate")
