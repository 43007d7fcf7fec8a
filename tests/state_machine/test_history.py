"""State machine rules for published snapshots stored in the object store (`app/state_machine/history.py`).

A deleted snapshot whose blob no other snapshot of the stream shares must put that blob on the
deletion queue (GC_QUEUE); one still shared by another offset must not.
"""

from __future__ import annotations

import hashlib

import pytest

from app.raft.messages import Entry
from app.state_machine import records as r
from app.state_machine.commands import (
    Append,
    Code,
    Command,
    CreateBucket,
    CreateStream,
    DeleteSnapshot,
    DeleteStream,
    Outcome,
    PublishSnapshot,
    Retain,
    encode_envelope,
)
from app.state_machine.machine import StateMachine
from app.storage.kv import MemoryKV
from tests.state_machine.helpers import T0, B

TEXT = "text/plain"


class Machine:
    """A state machine on MemoryKV, one Raft entry per apply batch."""

    def __init__(self) -> None:
        self.kv = MemoryKV(r.COLUMN_FAMILIES)
        self.sm = StateMachine(self.kv)
        self.index = self.sm.applied_index
        assert self.apply(CreateBucket(B))[0].code is Code.CREATED

    def apply(self, *cmds: Command) -> list[Outcome]:
        entries = []
        for cmd in cmds:
            self.index += 1
            entries.append(Entry(1, self.index, encode_envelope(T0, cmd)))
        return self.sm.apply(entries)

    def one(self, cmd: Command) -> Outcome:
        return self.apply(cmd)[0]

    def queued(self) -> set[str]:
        return {k.decode() for k, _ in self.kv.scan(r.GC_QUEUE, b"")}


def large(pos: int, blob: bytes, stream: str = "s") -> PublishSnapshot:
    sha = hashlib.sha256(blob).hexdigest()
    return PublishSnapshot(
        B, stream, pos, "application/octet-stream", sha, len(blob), key=f"{B}/{stream}/snapshots/{sha}.bin"
    )


@pytest.fixture()
def m() -> Machine:
    machine = Machine()
    assert machine.one(CreateStream(B, "s", TEXT, False, body=b"aaa")).code is Code.CREATED
    assert machine.one(Append(B, "s", TEXT, b"bbb")).code is Code.APPENDED
    return machine


def test_deleting_a_snapshot_whose_blob_is_shared_keeps_the_blob(m: Machine) -> None:
    first, second = large(3, b"same"), large(6, b"same")
    assert first.key == second.key
    assert m.one(first).code is Code.CREATED
    assert m.one(second).code is Code.CREATED
    assert m.one(DeleteSnapshot(B, "s", 3)).code is Code.DELETED
    assert first.key not in m.queued()
    assert m.sm.snapshot_at(m.sm.lookup(B, "s").sid, 3) is None
    assert m.sm.snapshot_at(m.sm.lookup(B, "s").sid, 6) is not None


def test_deleting_a_snapshot_in_the_batch_that_published_it_queues_its_blob(m: Machine) -> None:
    older, newer = large(3, b"older"), large(6, b"newer")
    outcomes = m.apply(older, newer, DeleteSnapshot(B, "s", 3))
    assert [o.code for o in outcomes] == [Code.CREATED, Code.CREATED, Code.DELETED]
    assert older.key in m.queued()
    assert newer.key not in m.queued()


def test_deleting_an_older_snapshot_queues_its_unshared_blob(m: Machine) -> None:
    older, newer = large(3, b"older"), large(6, b"newer")
    assert m.one(older).code is Code.CREATED
    assert m.one(newer).code is Code.CREATED
    assert m.one(DeleteSnapshot(B, "s", 3)).code is Code.DELETED
    assert older.key in m.queued()
    assert newer.key not in m.queued()


def test_a_refused_publish_queues_the_object_it_uploaded_unless_a_snapshot_names_it(m: Machine) -> None:
    kept = large(3, b"kept")
    assert m.one(kept).code is Code.CREATED
    beyond, conflict = large(99, b"beyond"), large(3, b"other")
    assert m.one(beyond).code is Code.BEYOND_TAIL
    assert m.one(conflict).code is Code.SNAPSHOT_CONFLICT
    assert m.one(large(2, b"kept")).code is Code.NOT_BOUNDARY  # its object is the one at 3
    assert m.one(kept).code is Code.EXISTS
    missing = large(0, b"gone", stream="nope")
    assert m.one(missing).code is Code.NOT_FOUND
    assert m.queued() == {beyond.key, conflict.key, missing.key}
    assert m.one(large(6, b"beyond")).code is Code.CREATED  # published after all: taken off the queue
    assert m.queued() == {conflict.key, missing.key}


def test_the_snapshot_index_is_kept_as_on_load(m: Machine) -> None:
    m.apply(large(3, b"one"), large(6, b"one"), large(0, b"two"))
    assert m.one(PublishSnapshot(B, "s", 6, TEXT, "ab" * 32, 5, inline=b"12345")).code is Code.SNAPSHOT_CONFLICT
    m.one(DeleteSnapshot(B, "s", 0))
    table = m.sm.table
    sid = m.sm.lookup(B, "s").sid
    assert table.snapshot_objects == {sid: {large(3, b"one").key: 2}}
    assert table.snapshot_sizes == {sid: 6}
    loaded = StateMachine(m.kv).table
    assert (loaded.snapshot_objects, loaded.snapshot_sizes) == (table.snapshot_objects, table.snapshot_sizes)
    m.one(DeleteStream(B, "s"))
    assert (table.snapshot_objects, table.snapshot_sizes) == ({}, {})
    assert large(3, b"one").key in m.queued()


def test_history_retained_for_forks_is_deleted_when_the_last_fork_goes(m: Machine) -> None:
    sid = m.sm.lookup(B, "s").sid
    assert m.one(CreateStream(B, "f", TEXT, False, fork_stream="s", fork_offset=6)).code is Code.CREATED
    assert m.one(Retain(B, "s", 6)).code is Code.OK
    assert len(list(m.kv.scan(r.DATA, r.data_key(sid, 0), r.data_key(sid + 1, 0)))) == 2  # the fork reads them
    local = m.sm.table.local_bytes
    assert m.one(DeleteStream(B, "f")).code is Code.DELETED
    assert list(m.kv.scan(r.DATA, r.data_key(sid, 0), r.data_key(sid + 1, 0))) == []
    assert m.sm.table.local_bytes == local - 6
    assert m.sm.lookup(B, "s").earliest == 6
