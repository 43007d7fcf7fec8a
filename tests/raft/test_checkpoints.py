"""Checkpoints, driven by hand: the leader's side, the follower's, and the storage halves.

Every test steps `RaftCore` instances directly and delivers (or drops) their messages itself,
so each scenario is exact and deterministic. The last tests cover the storage halves of a
checkpoint: `LogStore.restore` moving the log behind it, and the state machine's export/load.
"""

from __future__ import annotations

import pytest

from app.cluster import log_store
from app.cluster.log_store import LogStore
from app.raft.core import RaftCore
from app.raft.messages import MEMBERSHIP, AppendEntries, AppendResponse, Entry, HardState, encode
from app.raft.ready import Ready, Role
from app.state_machine import records as r
from app.state_machine.commands import Append, Code, CreateStream, encode_envelope
from app.state_machine.export import Pair, applied_point, export, load
from app.state_machine.machine import COMPAT_BUCKET, StateMachine
from app.storage.kv import MemoryKV
from tests.raft.helpers import ack, appends_to, cfg, commit_membership, drain, elect, sent_to
from tests.state_machine.helpers import T0, dump

# 1. Checkpoints from the leader's side and the follower's


def _leader_with_a_lagging_follower() -> tuple[RaftCore, RaftCore]:
    """Leader 1 has entries 1..5 committed and applied (node 2 acked), compacted through 3;
    node 3 was down for all of it and has an empty log."""
    leader = elect(learners=())
    for data in (b"a", b"b", b"c", b"d"):
        leader.propose(data)
    rd = drain(leader)
    assert appends_to(rd, 3)  # dropped: node 3 is down
    ack(leader, 2)
    assert [e.index for e in drain(leader).committed] == [1, 2, 3, 4, 5]
    leader.compact(3)
    assert (leader.log.checkpoint_index, leader.log.checkpoint_term, leader.log.last_index()) == (3, 1, 5)
    return leader, RaftCore(3, [1, 2, 3], HardState(), [])


def _request_checkpoint(leader: RaftCore, follower: RaftCore) -> Ready:
    """A heartbeat reaches the follower, which rejects it; the leader backs off below its checkpoint index."""
    leader.tick()
    (heartbeat,) = appends_to(drain(leader), 3)
    assert heartbeat.prev_index == 5  # pipelining had already moved next[3] past the checkpoint index
    follower.step(heartbeat)
    (reject,) = drain(follower).messages
    assert isinstance(reject, AppendResponse) and not reject.success
    leader.step(reject)
    assert leader.tracker.progress[3].next <= leader.log.checkpoint_index
    return drain(leader)


def _assert_only_probes(leader: RaftCore, rd: Ready) -> list[AppendEntries]:
    probes = appends_to(rd, 3)
    assert probes and sent_to(rd, 3) == probes
    log = leader.log
    for probe in probes:
        assert (probe.prev_index, probe.prev_term, probe.entries) == (log.checkpoint_index, log.checkpoint_term, [])
    return probes


def test_lagging_follower_is_listed_for_a_checkpoint_once_and_probed_meanwhile() -> None:
    leader, follower = _leader_with_a_lagging_follower()
    rd = _request_checkpoint(leader, follower)
    assert rd.checkpoints == [3]
    _assert_only_probes(leader, rd)

    for _ in range(3):  # heartbeats during the transfer: probes only, no second request
        leader.tick()
        rd = drain(leader)
        assert rd.checkpoints == []
        _assert_only_probes(leader, rd)

    index = leader.propose(b"e")  # new entries go to node 2, never to the checkpointing node
    rd = drain(leader)
    assert rd.checkpoints == []
    assert [e.index for m in appends_to(rd, 2) for e in m.entries] == [index]
    _assert_only_probes(leader, rd)


def test_rejections_are_ignored_while_a_checkpoint_is_in_flight() -> None:
    leader, follower = _leader_with_a_lagging_follower()
    rd = _request_checkpoint(leader, follower)
    (probe,) = appends_to(rd, 3)
    follower.step(probe)  # it still lacks the checkpoint's entry, so it rejects the probe
    (reject,) = drain(follower).messages
    assert isinstance(reject, AppendResponse) and not reject.success
    next_before = leader.tracker.progress[3].next
    leader.step(reject)
    rd = drain(leader)
    assert sent_to(rd, 3) == [] and rd.checkpoints == []  # no back-off answer, no new request
    assert leader.tracker.progress[3].next == next_before and leader.tracker.progress[3].checkpointing


def test_finished_transfer_lets_the_next_heartbeat_ask_again() -> None:
    leader, follower = _leader_with_a_lagging_follower()
    assert _request_checkpoint(leader, follower).checkpoints == [3]
    leader.checkpoint_finished(3)  # e.g. the transfer failed: the follower still needs one
    assert not leader.tracker.progress[3].checkpointing
    leader.tick()
    rd = drain(leader)
    assert rd.checkpoints == [3]
    _assert_only_probes(leader, rd)
    leader.tick()
    assert drain(leader).checkpoints == []  # once per transfer again


def test_installed_checkpoint_puts_the_follower_back_on_the_log() -> None:
    leader, follower = _leader_with_a_lagging_follower()
    _request_checkpoint(leader, follower)
    new_index = leader.propose(b"e")  # arrives while the checkpoint is streaming
    drain(leader)

    # The driver streamed the leader's store at its applied index, 5, which is past the checkpoint index 3.
    assert follower.can_install_checkpoint(leader.term, 5)
    follower.install_checkpoint(leader.term, 1, 5, 1, cfg([1, 2, 3]))
    assert (follower.log.checkpoint_index, follower.log.checkpoint_term, follower.log.last_index()) == (5, 1, 5)
    assert (follower.commit, follower.applied, follower.log.entries) == (5, 5, [])
    assert follower.leader == 1 and follower.role is Role.FOLLOWER
    rd = drain(follower)
    assert rd.messages == [AppendResponse(leader.term, 3, 1, True, 5)]
    assert rd.committed == []  # the checkpoint already holds entries up to 5

    leader.step(rd.messages[0])
    assert (leader.tracker.progress[3].match, leader.tracker.progress[3].next) == (5, new_index + 1)
    assert not leader.tracker.progress[3].checkpointing
    rd = drain(leader)
    assert rd.checkpoints == []
    (append,) = appends_to(rd, 3)
    assert append.prev_index == 5 and [e.index for e in append.entries] == [new_index]

    follower.step(append)
    (reply,) = drain(follower).messages
    assert isinstance(reply, AppendResponse) and reply.success and reply.match_index == new_index
    assert [e.data for e in follower.log.entries] == [b"e"]


def test_installed_follower_accepts_a_probe_from_below_its_checkpoint() -> None:
    """A probe sent before the leader saw the install reply names the leader's (lower) checkpoint index."""
    leader, follower = _leader_with_a_lagging_follower()
    (probe,) = appends_to(_request_checkpoint(leader, follower), 3)
    follower.install_checkpoint(leader.term, 1, 5, 1, cfg([1, 2, 3]))
    drain(follower)
    assert probe.prev_index == 3 < follower.log.checkpoint_index
    follower.step(probe)
    assert drain(follower).messages == [AppendResponse(leader.term, 3, 1, True, 5, probe.round)]


def test_removing_a_checkpointing_node_forgets_its_transfer() -> None:
    """Otherwise a node removed mid-transfer would linger as a checkpoint target."""
    leader, follower = _leader_with_a_lagging_follower()
    _request_checkpoint(leader, follower)
    assert leader.tracker.progress[3].checkpointing
    commit_membership(leader, cfg([1, 2]))
    assert leader.voters == [1, 2] and 3 not in leader.tracker.progress


def test_deposed_leader_does_not_ask_for_a_checkpoint() -> None:
    leader, follower = _leader_with_a_lagging_follower()
    leader.tick()
    (heartbeat,) = appends_to(drain(leader), 3)
    follower.step(heartbeat)
    leader.step(drain(follower).messages[0])  # the rejection queues a checkpoint request for node 3
    leader.step(AppendEntries(leader.term + 1, 2, 1, 5, 1, [], 5))  # before that Ready: node 2 leads term 2
    assert leader.role is Role.FOLLOWER
    assert leader.ready().checkpoints == []


# 2. can_install_checkpoint and install_checkpoint on the follower


def _follower_with_log() -> RaftCore:
    """Term 2; entries 1..3 of term 1 and 4..6 of term 2, all persisted; 2 committed and applied."""
    entries = [Entry(1, i, b"x%d" % i) for i in (1, 2, 3)] + [Entry(2, i, b"x%d" % i) for i in (4, 5, 6)]
    return RaftCore(2, [1, 2, 3], HardState(term=2, vote=1, commit=2), entries, applied=2)


@pytest.mark.parametrize(
    ("term", "index", "expected"),
    [
        (1, 5, False),  # from a leader of an older term
        (2, 1, False),  # below the commit index
        (2, 2, False),  # at the commit index
        (2, 3, True),
        (2, 9, True),  # beyond the log
        (3, 3, True),  # from a newer term
    ],
)
def test_can_install_checkpoint(term: int, index: int, expected: bool) -> None:
    assert _follower_with_log().can_install_checkpoint(term, index) is expected


def test_install_keeps_the_log_past_a_matching_index() -> None:
    follower = _follower_with_log()
    follower.install_checkpoint(2, 1, 4, 2, cfg([1, 2, 3], [4]))
    assert (follower.log.checkpoint_index, follower.log.checkpoint_term) == (4, 2)
    assert [e.index for e in follower.log.entries] == [5, 6] and follower.log.last_index() == 6
    assert (follower.commit, follower.applied) == (4, 4)
    assert (follower.voters, follower.learners) == ([1, 2, 3], [4])
    rd = drain(follower)
    assert rd.entries == []  # the kept entries are already on disk
    assert rd.messages == [AppendResponse(2, 2, 1, True, 4)]


def test_install_drops_the_whole_log_when_the_terms_differ() -> None:
    follower = _follower_with_log()
    follower.install_checkpoint(3, 1, 4, 3, cfg([1, 2, 3]))  # the leader's entry 4 is of term 3: ours diverged
    assert (follower.log.checkpoint_index, follower.log.checkpoint_term) == (4, 3)
    assert follower.log.entries == [] and follower.log.last_index() == 4 and follower.log.last_term() == 3
    assert (follower.commit, follower.applied) == (4, 4)
    assert (follower.term, follower.vote, follower.leader) == (3, 0, 1)
    rd = drain(follower)
    assert rd.hard_state is not None and rd.hard_state.term == 3  # the new term is made durable
    assert rd.entries == [] and rd.committed == []
    assert rd.messages == [AppendResponse(3, 2, 1, True, 4)]


def test_install_drops_the_log_when_the_index_is_past_its_end() -> None:
    follower = _follower_with_log()
    follower.install_checkpoint(2, 1, 9, 2, cfg([1, 2, 3]))
    assert follower.log.entries == []
    assert (follower.log.checkpoint_index, follower.log.last_index(), follower.commit) == (9, 9, 9)


# LogStore.restore


def _log_store() -> tuple[MemoryKV, LogStore]:
    """Entries 1..3 of term 1 and 4..6 of term 2."""
    kv = MemoryKV(log_store.COLUMN_FAMILIES)
    store = LogStore(kv)
    entries = [Entry(1, i, b"x") for i in (1, 2, 3)] + [Entry(2, i, b"y") for i in (4, 5, 6)]
    store.save(HardState(term=2, vote=1, commit=3), entries)
    return kv, store


@pytest.mark.parametrize(
    ("index", "term", "kept", "last"),
    [
        (4, 2, [5, 6], 6),  # agrees at 4: the suffix survives
        (3, 1, [4, 5, 6], 6),
        (4, 3, [], 4),  # disagrees at 4: everything goes
        (6, 2, [], 6),  # agrees at the last entry: nothing left past it
        (9, 2, [], 9),  # past the end
    ],
)
def test_log_store_restore(index: int, term: int, kept: list[int], last: int) -> None:
    kv, store = _log_store()
    store.restore(index, term)
    for view in (store, LogStore(kv)):  # the same in memory and after reopening
        assert (view.compacted_index, view.compacted_term) == (index, term)
        assert [e.index for e in view.entries()] == kept
        assert view.last_index == last
        assert view.term_at(index) is None
    assert LogStore(kv).hard_state() == HardState(term=2, vote=1, commit=3)


def test_log_store_appends_after_a_restore_that_dropped_everything() -> None:
    kv, store = _log_store()
    store.restore(4, 3)
    store.save(None, [Entry(3, 5, b"z")])
    reopened = LogStore(kv)
    assert [(e.index, e.term) for e in reopened.entries()] == [(5, 3)]
    assert reopened.last_index == 5


# The state machine's export and load: a checkpoint's body


def _machine(appends: int = 2, body: bytes = b"hello ") -> tuple[MemoryKV, StateMachine]:
    """A store with two streams, `appends` records on the first, and a membership entry applied."""
    kv = MemoryKV(r.COLUMN_FAMILIES)
    sm = StateMachine(kv)
    cmds = [
        CreateStream(COMPAT_BUCKET, "s", "text/plain", False),
        CreateStream(COMPAT_BUCKET, "t", "text/plain", False),
    ]
    cmds += [Append(COMPAT_BUCKET, "s", "text/plain", body + b"%d" % i) for i in range(appends)]
    entries = [Entry(2, i, encode_envelope(T0 + i, cmd)) for i, cmd in enumerate(cmds, start=1)]
    entries.append(Entry(2, len(entries) + 1, encode(cfg([1, 2, 3], [4])), MEMBERSHIP))
    outcomes = sm.apply(entries[:2]) + sm.apply(entries[2:])
    assert [o.code for o in outcomes if o is not None] == [Code.CREATED] * 2 + [Code.APPENDED] * appends
    sm.make_durable()  # leaves the node-local sync marker, which a checkpoint must not carry
    return kv, sm


def _read(sm: StateMachine, name: str) -> bytes:
    meta = sm.lookup(COMPAT_BUCKET, name)
    assert meta is not None
    return b"".join(bytes(p) for p in sm.read(meta, 0, 1 << 20).payloads)


def test_exported_store_loads_into_an_identical_state_machine() -> None:
    kv, sm = _machine()
    copy = MemoryKV(r.COLUMN_FAMILIES)
    for batch in export(kv):
        load(copy, batch)
    twin = StateMachine(copy)

    assert (twin.applied_index, twin.applied_term) == (sm.applied_index, sm.applied_term) == (5, 2)
    assert applied_point(copy) == (5, 2)
    assert twin.streams == sm.streams and twin.names == sm.names and twin.next_sid == sm.next_sid
    assert twin.membership == sm.membership == cfg([1, 2, 3], [4])
    assert _read(twin, "s") == _read(sm, "s") == b"hello 0hello 1"
    assert _read(twin, "t") == b""

    assert kv.get(r.SM_META, r.SYNCED_KEY) is not None and copy.get(r.SM_META, r.SYNCED_KEY) is None
    expected = dump(kv)
    expected[r.SM_META] = [(k, v) for k, v in expected[r.SM_META] if k != r.SYNCED_KEY]
    assert dump(copy) == expected


def _pair_bytes(pairs: list[Pair]) -> int:
    return sum(len(key) + len(value) for _, key, value in pairs)


def test_export_batches_stay_near_max_bytes() -> None:
    kv, _ = _machine(appends=40, body=b"m" * 40)
    max_bytes = 512
    batches = list(export(kv, max_bytes))
    assert len(batches) > 3
    for batch in batches:
        assert _pair_bytes(batch[:-1]) < max_bytes  # a batch overshoots by at most its last pair
    for batch in batches[:-1]:
        assert _pair_bytes(batch) >= max_bytes // 2  # and is not cut needlessly short
    flat = [pair for batch in batches for pair in batch]
    (whole,) = list(export(kv))
    assert flat == whole  # same pairs, same (column family, key) order
    assert [(p, k) for p, k, _ in flat] == sorted((p, k) for p, k, _ in flat)
