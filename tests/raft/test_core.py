"""The pure Raft core: single-voter commit, elections, replication, and a seeded simulation."""

from __future__ import annotations

import random

import pytest

from app.raft.core import RaftCore
from app.raft.messages import AppendEntries, Entry, HardState, Message
from app.raft.ready import Role
from tests.raft.helpers import drain


def test_single_voter_commits_after_its_own_sync() -> None:
    core = RaftCore(1, [1], HardState(), [])
    core.campaign()
    assert core.role is Role.LEADER
    index = core.propose(b"a")
    assert index == 2  # after the leader's no-op
    rd = core.ready()
    assert [e.data for e in rd.entries] == [b"", b"a"]
    assert rd.committed == []  # nothing commits before it is persisted
    core.on_persisted(2, core.term)
    rd = core.ready()
    assert [e.data for e in rd.committed] == [b"", b"a"]


def test_follower_rejects_proposals() -> None:
    core = RaftCore(1, [1, 2, 3], HardState(), [])
    assert core.propose(b"x") is None


def test_restart_keeps_term_vote_and_log() -> None:
    entries = [Entry(1, 1, b""), Entry(1, 2, b"a")]
    core = RaftCore(1, [1], HardState(term=1, vote=1, commit=2), entries, applied=2)
    core.campaign()
    assert core.term == 2
    assert core.log.last_index() == 3  # the new term's no-op follows the old log
    rd = drain(core)
    assert rd.hard_state is not None and rd.hard_state.term == 2


def test_follower_truncates_a_divergent_suffix() -> None:
    follower = RaftCore(2, [1, 2, 3], HardState(term=1), [Entry(1, 1, b"x"), Entry(1, 2, b"stale")])
    follower.step(AppendEntries(2, 1, 2, 1, 1, [Entry(2, 2, b"new"), Entry(2, 3, b"more")], 0))
    assert [e.data for e in follower.log.entries] == [b"x", b"new", b"more"]
    rd = follower.ready()
    assert [e.index for e in rd.entries] == [2, 3]  # the store overwrites from index 2


def test_follower_rejects_append_with_gap_and_hints() -> None:
    follower = RaftCore(2, [1, 2, 3], HardState(term=1), [Entry(1, 1, b"x")])
    follower.step(AppendEntries(1, 1, 2, 5, 1, [Entry(1, 6, b"y")], 0))
    (reply,) = follower.ready().messages
    assert not reply.success and reply.match_index == 1


class Cluster:
    """Deterministic network of cores: seeded drops, reordering and partitions; a fake clock of ticks."""

    def __init__(self, seed: int, size: int = 3, pre_vote: bool = True) -> None:
        self.rng = random.Random(seed)
        ids = list(range(1, size + 1))
        self.cores = {i: RaftCore(i, ids, HardState(), [], seed=seed, pre_vote=pre_vote) for i in ids}
        self.inflight: list[Message] = []
        self.applied: dict[int, list[Entry]] = {i: [] for i in ids}
        self.leaders: dict[int, set[int]] = {}
        self.cut: set[int] = set()

    def step(self, drop: float) -> None:
        for core in self.cores.values():
            core.tick()
        self.rng.shuffle(self.inflight)
        deliver, self.inflight = self.inflight, []
        for msg in deliver:
            if msg.src in self.cut or msg.dst in self.cut or self.rng.random() < drop:
                continue
            self.cores[msg.dst].step(msg)
        for node_id, core in self.cores.items():
            rd = drain(core)
            self.inflight += rd.messages
            self.applied[node_id] += rd.committed
            if core.role is Role.LEADER:
                self.leaders.setdefault(core.term, set()).add(node_id)

    def leader(self) -> RaftCore | None:
        leaders = [c for c in self.cores.values() if c.role is Role.LEADER and c.id not in self.cut]
        return max(leaders, key=lambda c: c.term) if leaders else None


@pytest.mark.parametrize("seed", range(200))
def test_simulation_safety_and_progress(seed: int) -> None:
    cluster = Cluster(seed)
    proposed = 0
    for step in range(400):
        if step % 97 == 0:
            cluster.cut = {cluster.rng.choice(list(cluster.cores))} if step < 300 else set()
        leader = cluster.leader()
        if leader is not None and cluster.rng.random() < 0.3:
            leader.propose(f"{seed}-{proposed}".encode())
            proposed += 1
        cluster.step(drop=0.1 if step < 300 else 0.0)
    for _ in range(100):
        cluster.step(drop=0.0)

    # Election safety: at most one leader per term.
    assert all(len(ids) == 1 for ids in cluster.leaders.values())
    # State machine safety: every node applied a prefix of the same sequence.
    logs = [[(e.term, e.index, e.data) for e in entries] for entries in cluster.applied.values()]
    longest = max(logs, key=len)
    for log in logs:
        assert log == longest[: len(log)]
    # Progress once the network heals: everyone catches up to the same commit.
    assert len({len(log) for log in logs}) == 1
    assert any(data for _, _, data in longest) or proposed == 0


def _settle(cluster: Cluster, steps: int = 100) -> RaftCore:
    for _ in range(steps):
        cluster.step(drop=0.0)
    leader = cluster.leader()
    assert leader is not None
    return leader


@pytest.mark.parametrize("seed", range(20))
def test_pre_vote_keeps_a_rejoining_node_from_deposing_the_leader(seed: int) -> None:
    cluster = Cluster(seed)
    leader = _settle(cluster)
    term = leader.term
    follower = next(i for i in cluster.cores if i != leader.id)
    cluster.cut = {follower}
    for _ in range(200):  # many election timeouts alone: without pre-vote its term would climb
        cluster.step(drop=0.0)
    assert cluster.cores[follower].term == term
    cluster.cut = set()
    _settle(cluster)
    assert cluster.leader() is leader and leader.term == term


def test_without_pre_vote_a_rejoining_node_bumps_the_term() -> None:
    cluster = Cluster(1, pre_vote=False)
    leader = _settle(cluster)
    term = leader.term
    follower = next(i for i in cluster.cores if i != leader.id)
    cluster.cut = {follower}
    for _ in range(200):
        cluster.step(drop=0.0)
    cluster.cut = set()
    assert _settle(cluster).term > term


@pytest.mark.parametrize("seed", range(20))
def test_check_quorum_steps_an_isolated_leader_down(seed: int) -> None:
    cluster = Cluster(seed)
    leader = _settle(cluster)
    cluster.cut = {leader.id}
    for _ in range(2 * leader.election_ticks + 1):
        cluster.step(drop=0.0)
    assert leader.role is not Role.LEADER  # it stops taking writes it could never commit
    for _ in range(100):
        cluster.step(drop=0.0)
    new_leader = cluster.leader()
    assert new_leader is not None and new_leader.id != leader.id


@pytest.mark.parametrize("seed", range(20))
def test_leadership_transfer_hands_over_without_losing_entries(seed: int) -> None:
    cluster = Cluster(seed)
    leader = _settle(cluster)
    for i in range(5):
        leader.propose(b"before-%d" % i)
    target = leader.transfer_leadership()
    assert target != 0
    assert leader.propose(b"refused") is None  # no new proposals while handing over
    for _ in range(30):
        cluster.step(drop=0.0)
    new_leader = cluster.leader()
    assert new_leader is not None and new_leader.id == target
    assert new_leader.term == leader.term and leader.role is Role.FOLLOWER
    _settle(cluster)
    applied = [e.data for e in cluster.applied[leader.id] if e.data]
    assert applied == [b"before-%d" % i for i in range(5)]


@pytest.mark.parametrize("seed", range(10))
def test_leadership_goes_to_a_voter_still_answering_not_one_that_stopped(seed: int) -> None:
    """A rolling restart stops a follower, then the leader: the leader must not hand over to the
    stopped one (as caught up as any), which would never campaign."""
    cluster = Cluster(seed, size=5)
    leader = _settle(cluster)
    leader.propose(b"x")
    _settle(cluster)
    stopped = min(p for p in cluster.cores if p != leader.id)  # the lowest id: the old choice on a tie
    cluster.cut = {stopped}
    for _ in range(2):  # two heartbeats unanswered
        cluster.step(drop=0.0)
    target = leader.transfer_leadership()
    assert target not in (0, stopped)
    for _ in range(30):
        cluster.step(drop=0.0)
    new_leader = cluster.leader()
    assert new_leader is not None and new_leader.id == target


def test_no_transfer_is_started_when_no_voter_answers() -> None:
    cluster = Cluster(1)
    leader = _settle(cluster)
    cluster.cut = {p for p in cluster.cores if p != leader.id}
    for _ in range(leader.election_ticks + 1):
        leader.tick()
        drain(leader)
    assert leader.transfer_leadership() == 0  # nobody would take over: shut down at once


def test_a_transfer_to_a_voter_that_stops_answering_is_given_up_within_half_an_election_timeout() -> None:
    cluster = Cluster(2)
    leader = _settle(cluster)
    target = leader.transfer_leadership()
    cluster.cut = {target}  # stopped as the hand-over began: the TimeoutNow is lost
    for _ in range(max(3 * leader.heartbeat_ticks, leader.election_ticks // 2) + 2):
        cluster.step(drop=0.0)
    assert leader.transferee == 0 and leader.role is Role.LEADER  # before an election timeout
    assert leader.propose(b"again") is not None  # taking proposals again


def test_a_caught_up_voter_heard_a_tick_before_a_lagging_one_is_still_chosen() -> None:
    cluster = Cluster(3)
    leader = _settle(cluster)
    caught_up, lagging = sorted(p for p in cluster.cores if p != leader.id)
    progress = leader.tracker.progress
    progress[lagging].match = 0  # as if it had fallen behind
    progress[caught_up].heard, progress[lagging].heard = leader.clock - 1, leader.clock
    assert leader.transfer_leadership() == caught_up
