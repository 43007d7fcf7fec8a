"""Learners and one-node-at-a-time membership changes, driven by hand.

Every test steps `RaftCore` instances directly and delivers (or drops) their messages itself,
so each scenario is exact and deterministic. Checkpoints are in test_checkpoints.py.
"""

from __future__ import annotations

import pytest

from app.raft.core import RaftCore
from app.raft.messages import MEMBERSHIP, AppendEntries, Entry, HardState, Membership, VoteResponse, encode
from app.raft.ready import Role
from tests.raft.helpers import ack, appends_to, cfg, commit_membership, drain, elect, ready_leader, sent_to

# 1. Learners


def test_learner_gets_the_log_but_its_acks_do_not_commit() -> None:
    leader = elect()
    leader.propose(b"a")
    rd = drain(leader)
    assert [e.index for m in appends_to(rd, 4) for e in m.entries] == [1, 2]  # replicated to the learner

    ack(leader, 4)
    assert leader.tracker.progress[4].match == 2  # the ack was taken...
    assert leader.commit == 0  # ...but the leader and a learner are not a majority of 3 voters
    assert drain(leader).committed == []

    ack(leader, 2)  # one voter's ack is enough, which shows the learner's was what fell short
    assert leader.commit == 2
    assert [e.data for e in drain(leader).committed] == [b"", b"a"]


def test_learner_acks_do_not_keep_a_leader_in_power() -> None:
    """Check-quorum counts only voters: a leader that hears from nobody but its learner steps down."""
    leader = elect()
    drain(leader)
    for _ in range(leader.election_ticks):
        ack(leader, 4)
        leader.tick()
    assert leader.role is Role.FOLLOWER


def test_learner_never_starts_an_election() -> None:
    learner = RaftCore(4, [1, 2, 3], HardState(), [], learners=[4])
    voter = RaftCore(3, [1, 2, 3], HardState(), [], learners=[4])
    for _ in range(5 * learner.election_ticks):  # several timeouts: enough for the voter
        learner.tick()
        voter.tick()
    assert voter.role is Role.PRE_CANDIDATE
    assert learner.role is Role.FOLLOWER and learner.term == 0
    assert not learner.ready().messages


def test_votes_from_non_voters_are_ignored() -> None:
    candidate = RaftCore(1, [1, 2, 3], HardState(), [], learners=[4])
    candidate.start_election()
    assert candidate.role is Role.PRE_CANDIDATE
    candidate.step(VoteResponse(1, 4, 1, True, pre_vote=True))  # the learner
    candidate.step(VoteResponse(1, 9, 1, True, pre_vote=True))  # a stranger
    assert candidate.role is Role.PRE_CANDIDATE and candidate.term == 0

    candidate.step(VoteResponse(1, 2, 1, True, pre_vote=True))
    assert candidate.role is Role.CANDIDATE and candidate.term == 1
    candidate.step(VoteResponse(1, 4, 1, True))
    candidate.step(VoteResponse(1, 9, 1, True))
    assert candidate.role is Role.CANDIDATE

    candidate.step(VoteResponse(1, 3, 1, True))
    assert candidate.role is Role.LEADER


# 2. Which membership changes a leader accepts


def test_follower_refuses_membership_changes() -> None:
    follower = RaftCore(2, [1, 2, 3], HardState(), [], learners=[4])
    new = cfg([1, 2, 3], [4, 5])
    assert follower.membership_error(new) == "not the leader"
    assert follower.propose_membership(new, encode(new)) is None
    assert follower.log.last_index() == 0


def test_new_leader_refuses_membership_until_its_no_op_is_applied() -> None:
    """A change from an earlier term may still be in flight until the new term's no-op applies."""
    leader = elect()
    new = cfg([1, 2, 3], [4, 5])
    assert leader.pending_membership == 1
    assert leader.membership_error(new) is not None
    assert leader.propose_membership(new, encode(new)) is None

    drain(leader)
    ack(leader, 2)
    assert leader.commit == 1
    assert leader.membership_error(new) is not None  # committed is not enough
    rd = leader.ready()
    assert [e.index for e in rd.committed] == [1]
    assert leader.membership_error(new) is not None  # handed out for applying is not enough either
    leader.on_applied(1)
    assert leader.membership_error(new) is None
    assert leader.propose_membership(new, encode(new)) == 2


@pytest.mark.parametrize(
    "new",
    [
        pytest.param(cfg([1, 2, 3], [4, 5]), id="add-learner"),
        pytest.param(cfg([1, 2, 3, 4]), id="promote-learner"),
        pytest.param(cfg([1, 2], [4]), id="remove-voter"),
        pytest.param(cfg([1, 2, 3]), id="remove-learner"),
        pytest.param(cfg([2, 3], [4]), id="remove-the-leader"),
    ],
)
def test_leader_accepts_a_one_node_change(new: Membership) -> None:
    leader = ready_leader()
    assert leader.membership_error(new) is None
    index = leader.propose_membership(new, encode(new))
    assert index == 2 and leader.pending_membership == 2
    entry = leader.log.entries[-1]
    assert (entry.index, entry.kind, entry.data) == (2, MEMBERSHIP, encode(new))


@pytest.mark.parametrize(
    "new",
    [
        pytest.param(cfg([1, 2, 3, 5], [4]), id="add-voter-directly"),
        pytest.param(cfg([1, 2], [4, 5]), id="add-learner-and-remove-voter"),
        pytest.param(cfg([1, 2, 3, 4], [5]), id="promote-and-add"),
        pytest.param(cfg([1, 2, 3, 4], [4]), id="voter-and-learner-at-once"),
        pytest.param(cfg([], [1, 2, 3, 4]), id="no-voters"),
        pytest.param(cfg([1, 2, 3], [4]), id="no-change"),
        pytest.param(cfg([1, 2], [3, 4]), id="demote-voter"),
    ],
)
def test_leader_refuses_anything_but_a_one_node_change(new: Membership) -> None:
    leader = ready_leader()
    assert leader.membership_error(new) is not None
    assert leader.propose_membership(new, encode(new)) is None
    assert leader.log.last_index() == 1 and leader.pending_membership == 1


def test_second_change_waits_until_the_first_is_applied() -> None:
    leader = ready_leader()
    first, second = cfg([1, 2, 3], [4, 5]), cfg([1, 2], [4, 5])
    assert leader.propose_membership(first, encode(first)) == 2
    assert leader.membership_error(second) == "another membership change is still in progress"
    assert leader.propose_membership(second, encode(second)) is None

    drain(leader)
    ack(leader, 2)
    rd = leader.ready()  # committed and handed out, not yet applied
    assert [e.index for e in rd.committed] == [2]
    assert leader.membership_error(second) is not None
    leader.on_applied(2)
    assert leader.membership_error(second) is None  # valid against the configuration `first` made
    assert leader.propose_membership(second, encode(second)) == 3


# 3. A membership entry takes effect when it commits


def test_added_learner_takes_effect_on_commit_and_gets_the_log() -> None:
    leader = ready_leader()
    new = cfg([1, 2, 3], [4, 5])
    index = leader.propose_membership(new, encode(new))
    assert index is not None
    rd = drain(leader)
    assert sent_to(rd, 5) == []  # not a member yet: nothing is sent to it
    ack(leader, 2)
    assert leader.commit == index
    assert leader.learners == [4] and 5 not in leader.tracker.progress  # committed, but not yet handed out

    rd = drain(leader)
    assert [(e.index, e.kind) for e in rd.committed] == [(index, MEMBERSHIP)]
    assert (leader.voters, leader.learners) == ([1, 2, 3], [4, 5])
    assert (leader.tracker.progress[5].next, leader.tracker.progress[5].match) == (index + 1, 0)

    leader.tick()  # the heartbeat now reaches the new learner
    assert len(appends_to(drain(leader), 5)) == 1


def test_follower_adopts_a_membership_entry_only_when_it_commits() -> None:
    follower = RaftCore(2, [1, 2, 3], HardState(), [], learners=[4])
    new = cfg([1, 2, 3], [4, 5])
    entries = [Entry(1, 1, b""), Entry(1, 2, encode(new), MEMBERSHIP)]
    follower.step(AppendEntries(1, 1, 2, 0, 0, entries, 1))
    assert drain(follower).committed == []  # nothing is applied before it is persisted
    rd = drain(follower)
    assert [e.index for e in rd.committed] == [1]
    assert follower.learners == [4]  # in the log, not committed: no effect

    follower.step(AppendEntries(1, 1, 2, 2, 1, [], 2))
    rd = drain(follower)
    assert [e.index for e in rd.committed] == [2]
    assert follower.learners == [4, 5]


def test_promoted_learner_counts_toward_commit() -> None:
    leader = ready_leader()
    commit_membership(leader, cfg([1, 2, 3, 4]))
    assert leader.voters == [1, 2, 3, 4] and leader.learners == []
    index = leader.propose(b"x")
    drain(leader)
    ack(leader, 2)
    assert leader.commit < index  # 2 of 4 voters is no longer a majority
    ack(leader, 4)
    assert leader.commit == index  # the promoted node's ack completes it


def test_removed_node_loses_its_progress_and_its_heartbeats() -> None:
    leader = ready_leader()
    drain(leader)
    assert 3 in leader.tracker.progress
    commit_membership(leader, cfg([1, 2], [4]))
    assert leader.voters == [1, 2]
    assert 3 not in leader.tracker.progress
    leader.tick()
    rd = drain(leader)
    assert sent_to(rd, 3) == [] and len(appends_to(rd, 2)) == 1


def test_leader_that_removes_itself_steps_down_and_stays_quiet() -> None:
    leader = ready_leader()
    index, rd = commit_membership(leader, cfg([2, 3], [4]))
    assert [e.index for e in rd.committed] == [index]
    assert leader.role is Role.FOLLOWER and leader.leader == 0
    assert leader.voters == [2, 3]
    for _ in range(5 * leader.election_ticks):  # no longer a voter: no campaigns
        leader.tick()
    assert leader.role is Role.FOLLOWER
    assert not [m for m in drain(leader).messages if not isinstance(m, AppendEntries)]
