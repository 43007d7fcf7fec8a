"""Tiering and eviction are deterministic: replicas and batchings end identical."""

from __future__ import annotations

from app.state_machine import records as r
from app.state_machine.commands import Code, Evict, ForgetObjects
from app.state_machine.machine import StateMachine
from app.tiering import segment as seg
from tests.state_machine.helpers import JSON, OCTET, T0, B, P, dump, jrec
from tests.state_machine.tiering_helpers import TH, U32, filled, replay, tier_cmd


def scenario(h: TH) -> None:
    """Appends, forks, tiering, eviction, deletes and forgetting, over several batches."""
    h.create("a", OCTET, body=b"aaaa")
    h.append("a", b"bb", ct=OCTET, producer=P(0, 0))
    h.create("j", JSON, body=jrec(1, 2))
    h.append("j", jrec({"k": "v"}), ct=JSON)
    h.tier("a", 4)
    h.tier("j")
    h.evict("a")
    h.fork("f", "a", offset=4)
    h.append("f", b"ff", ct=None, now=T0 + 10)
    h.tier("a")
    h.tier("f")
    h.evict("f")
    h.evict("j")
    h.one(tier_cmd(999, 0, 1, "x", 1, "y", 0, 0, U32.pack(0)))  # stale
    h.delete("a")
    h.create("gone", OCTET, body=b"g")
    h.tier("gone")
    h.delete("gone")
    h.delete("f")
    h.one(ForgetObjects([seg.segment_key(B, "a", 0, 4)]))
    h.create("a", OCTET, body=b"aaaa", now=T0 + 20)
    h.tier("a")


def test_replicas_applying_the_same_entries_end_identical() -> None:
    h = TH()
    scenario(h)
    assert h.gc_queue(), "the scenario leaves something queued"
    assert dump(h.kv)[r.SEGMENTS], "and something tiered"
    kv, outcomes = replay(h.batches)
    assert dump(kv) == dump(h.kv)
    again = StateMachine(kv)
    assert (again.untiered_bytes, again.local_bytes) == h.counters()
    assert again.streams == h.sm.streams


def test_tier_and_evict_in_one_batch_equal_separate_batches() -> None:
    sep = filled()
    grouped = filled()
    a = [sep.one(sep.segment_cmd("s", 5)), sep.one(Evict(sep.m("s").sid, 5))]
    b = grouped.batch(grouped.segment_cmd("s", 5), Evict(grouped.m("s").sid, 5))
    assert [o.code for o in a] == [Code.OK, Code.OK]
    assert [o.code for o in b] == [o.code for o in a]
    assert dump(grouped.kv) == dump(sep.kv)


def test_evict_two_segments_tiered_in_the_same_batch() -> None:
    h = filled()
    first = h.segment_cmd("s", 3)
    second = tier_cmd(first.sid, 3, 9, seg.segment_key(B, "s", 3, 9), 1, "0", T0, T0, U32.pack(0) + U32.pack(2))
    out = h.batch(first, second, Evict(first.sid, 9))
    assert [o.code for o in out] == [Code.OK, Code.OK, Code.OK]


def test_segments_sees_staged_segments_after_a_committed_one_in_the_same_batch() -> None:
    h = filled()
    h.tier("s", 3)
    second = h.segment_cmd("s", 9, lo=3)
    out = h.batch(second, Evict(second.sid, 9))
    assert [o.code for o in out] == [Code.OK, Code.OK]
    assert h.local_positions("s") == [9]
