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
    Outcome,
    PublishSnapshot,
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
