"""The leader's window of unanswered AppendEntries per peer (app/raft/progress.py, app/raft/leader.py)."""

from __future__ import annotations

from app.raft.core import RaftCore
from app.raft.messages import AppendResponse, HardState
from app.raft.progress import MAX_INFLIGHT
from tests.raft.helpers import ack, appends_to, drain, elect


def _indexes(leader: RaftCore, dst: int) -> list[list[int]]:
    """The entries of each AppendEntries the leader's next Ready sends `dst`."""
    return [[e.index for e in m.entries] for m in appends_to(drain(leader), dst)]


def test_a_peer_is_sent_at_most_the_window_unanswered_and_the_rest_goes_together() -> None:
    assert MAX_INFLIGHT == 2
    leader = elect(learners=())
    assert _indexes(leader, 2) == [[1]]  # the no-op
    leader.propose(b"a")
    assert _indexes(leader, 2) == [[2]]  # pipelined: the no-op is not answered yet
    leader.propose(b"b")
    leader.propose(b"c")
    assert _indexes(leader, 2) == []  # two unanswered: b and c wait
    ack(leader, 2, match=1)
    assert _indexes(leader, 2) == [[3, 4]]  # one answered: what waited goes in one message
    ack(leader, 2, match=4)
    leader.propose(b"d")
    assert _indexes(leader, 2) == [[5]]
    assert leader.tracker.progress[3].next == 3  # node 3 answered nothing: it got 1 and 2 only


def test_a_heartbeat_follows_what_is_in_flight_and_a_lost_append_is_sent_again() -> None:
    leader = elect(learners=())
    drain(leader)  # the no-op to node 2: lost
    leader.propose(b"a")
    drain(leader)  # entry 2: lost too, and the window is full
    leader.tick()
    (heartbeat,) = appends_to(drain(leader), 2)
    assert (heartbeat.prev_index, heartbeat.entries) == (2, [])
    follower = RaftCore(2, [1, 2, 3], HardState(), [])
    follower.step(heartbeat)
    (reject,) = drain(follower).messages
    assert isinstance(reject, AppendResponse) and not reject.success
    leader.step(reject)
    (again,) = appends_to(drain(leader), 2)
    assert again.prev_index == 0 and [e.index for e in again.entries] == [1, 2]
    follower.step(again)
    (accepted,) = drain(follower).messages
    assert isinstance(accepted, AppendResponse) and accepted.success and accepted.match_index == 2
