"""The queue of objects to delete: what deletes queue, and what tiering and ForgetObjects take off."""

from __future__ import annotations

from app.state_machine import records as r
from app.state_machine.cold_tier import manifest_of
from app.state_machine.commands import Code, CollectExpired, CreateStream, DeleteStream, ForgetObjects
from app.tiering import segment as seg
from tests.state_machine.helpers import OCTET, T0, B, dump
from tests.state_machine.tiering_helpers import TH, U32, filled, tier_cmd


def test_deleting_a_tiered_stream_queues_its_segments_and_manifest() -> None:
    h = filled()
    h.tier("s", 3)
    h.tier("s", 9)
    h.evict("s", 3)
    h.create("other", OCTET, body=b"xyz")
    h.tier("other")
    sid = h.m("s").sid
    assert h.gc_queue() == set()
    assert h.delete("s").code is Code.DELETED
    keys = {seg.segment_key(B, "s", 0, 3), seg.segment_key(B, "s", 3, 9), seg.manifest_key(B, "s")}
    assert h.gc_queue() == keys
    assert list(h.kv.scan(r.SEGMENTS, r.sid_key(sid), r.sid_key(sid + 1))) == []
    assert [s.key for s in h.sm.segments(h.m("other").sid, 0, 3)] == [seg.segment_key(B, "other", 0, 3)]


def test_deleting_an_untiered_stream_queues_nothing() -> None:
    h = filled()
    h.delete("s")
    assert h.gc_queue() == set()


def test_manifest_of_a_segment_key() -> None:
    for name in ("s", "a/b", "..", "%zz", "ü ß"):
        key = seg.segment_key(B, name, 5, 10)
        assert manifest_of(key) == seg.manifest_key(B, name)


def test_soft_deleted_source_keeps_its_segments_until_its_last_fork_goes() -> None:
    h = filled()
    h.tier("s", 5)
    h.tier("s", 10)
    h.evict("s", 5)
    h.fork("f1", "s", offset=9)
    h.fork("f2", "s", offset=3)
    h.append("f1", b"own", ct=None)
    h.tier("f1")
    src = h.m("s")
    assert h.delete("s").code is Code.DELETED
    assert h.m("s").deleted and h.gc_queue() == set()
    assert len(list(h.sm.segments(src.sid, 0, 10))) == 2
    assert h.cold_text("f2") == b"aaa", "forks still read the soft-deleted source's evicted range"
    assert h.delete("f2").code is Code.DELETED
    assert h.gc_queue() == set(), "f1 still references the source; f2 had no segments"
    assert h.delete("f1").code is Code.DELETED
    assert h.meta("s") is None
    assert h.gc_queue() == {
        seg.segment_key(B, "s", 0, 5),
        seg.segment_key(B, "s", 5, 10),
        seg.manifest_key(B, "s"),
        seg.segment_key(B, "f1", 9, 12),
        seg.manifest_key(B, "f1"),
    }
    assert dump(h.kv)[r.SEGMENTS] == []


def test_expired_stream_queues_its_segments() -> None:
    h = TH()
    h.create("t", OCTET, body=b"abc", ttl=1)
    h.tier("t")
    h.one(CollectExpired([h.m("t").sid]), now=T0 + 5000)
    assert h.gc_queue() == {seg.segment_key(B, "t", 0, 3), seg.manifest_key(B, "t")}


def test_forget_objects_removes_only_the_given_keys() -> None:
    h = filled()
    h.tier("s", 3)
    h.tier("s", 9)
    h.delete("s")
    queued = h.gc_queue()
    assert len(queued) == 3
    first = seg.segment_key(B, "s", 0, 3)
    assert h.one(ForgetObjects([first, "not/queued.parquet"])).code is Code.OK
    assert h.gc_queue() == queued - {first}
    assert h.one(ForgetObjects(sorted(queued))).code is Code.OK
    assert h.gc_queue() == set()
    assert h.one(ForgetObjects([])).code is Code.OK


def test_tiering_a_queued_key_takes_it_and_its_manifest_off_the_queue() -> None:
    h = filled()
    h.tier("s", 3)
    h.tier("s", 9)
    h.delete("s")
    assert h.gc_queue() == {seg.segment_key(B, "s", 0, 3), seg.segment_key(B, "s", 3, 9), seg.manifest_key(B, "s")}
    h.create("s", OCTET, body=b"AAA")  # the same name and the same first range
    h.append("s", b"B", ct=OCTET)
    assert h.tier("s", 3).code is Code.OK
    assert h.gc_queue() == {seg.segment_key(B, "s", 3, 9)}, "the old object at 3..9 is still garbage"
    assert h.tier("s").code is Code.OK  # 3..4: a different key
    assert h.gc_queue() == {seg.segment_key(B, "s", 3, 9)}


def test_tier_segment_in_the_same_batch_as_the_delete_that_queued_its_key() -> None:
    h = filled()
    h.tier("s", 3)
    key = seg.segment_key(B, "s", 0, 3)
    retier = tier_cmd(h.sm.next_sid, 0, 3, key, 1, "00", T0, T0, U32.pack(0))  # the recreated stream's
    out = h.batch(DeleteStream(B, "s"), CreateStream(B, "s", OCTET, False, body=b"aaa"), retier)
    assert [o.code for o in out] == [Code.DELETED, Code.CREATED, Code.OK]
    assert h.gc_queue() == set()
    assert [s.key for s in h.sm.segments(h.m("s").sid, 0, 3)] == [key]


def test_delete_after_tiering_in_the_same_batch_queues_the_new_segment() -> None:
    h = filled()
    cmd = h.segment_cmd("s", 5)
    out = h.batch(cmd, DeleteStream(B, "s"))
    assert [o.code for o in out] == [Code.OK, Code.DELETED]
    assert h.gc_queue() == {cmd.segment.key, seg.manifest_key(B, "s")}
    assert dump(h.kv)[r.SEGMENTS] == []
