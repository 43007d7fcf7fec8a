"""DeleteStream: removal, re-creation, and deletes in the same batch as other commands."""

from __future__ import annotations

from app.state_machine import records as r
from app.state_machine.commands import Append, Code, CreateStream, DeleteStream
from tests.state_machine.helpers import JSON, TEXT, B, H, P, dump


def test_delete_stream(h: H) -> None:
    sid = h.create("s", body=b"abc").sid
    h.append("s", b"d", producer=P(0, 0), stream_seq="5")
    out = h.delete("s")
    assert out.code is Code.DELETED and out.sid == sid
    assert h.meta("s") is None
    assert h.append("s", b"x").code is Code.NOT_FOUND
    assert h.delete("s").code is Code.NOT_FOUND
    kv = dump(h.kv)
    assert kv[r.NAMES] == kv[r.STREAMS] == kv[r.DATA] == kv[r.PRODUCERS] == []


def test_recreate_after_delete_is_fresh(h: H) -> None:
    old = h.create("s", body=b"old")
    h.append("s", b"x", producer=P(0, 0), stream_seq="9")
    h.delete("s")
    new = h.create("s", JSON)
    assert new.code is Code.CREATED and new.sid != old.sid and new.next_pos == 0
    assert h.json("s") == []
    assert h.append("s", b"1", JSON, producer=P(0, 0), stream_seq="1").code is Code.APPENDED
    assert h.json("s") == [1]


def test_hard_delete_in_the_same_batch_leaves_no_records() -> None:
    """BUG: a hard delete's range deletions run before the batch's puts.

    `Batch.ranges` are applied before `Batch.ops`, so records and producer state written
    earlier in the same apply batch survive the delete_range and leak into the KV.
    """
    h = H()
    h.batch(
        CreateStream(B, "s", TEXT, False, body=b"abc"),
        Append(B, "s", TEXT, b"d", producer=P(0, 0)),
        DeleteStream(B, "s"),
    )
    kv = dump(h.kv)
    assert kv[r.DATA] == []
    assert kv[r.PRODUCERS] == []


def test_delete_then_recreate_in_one_batch(h: H) -> None:
    h.create("s", body=b"old")
    out = h.batch(DeleteStream(B, "s"), CreateStream(B, "s", TEXT, False, body=b"new"))
    assert [o.code for o in out] == [Code.DELETED, Code.CREATED]
    assert h.text("s") == b"new"
