"""The untiered and local byte counters, live and rebuilt on restart."""

from __future__ import annotations

from app.state_machine.commands import Append, Code, CollectExpired
from tests.state_machine.helpers import OCTET, T0, B
from tests.state_machine.tiering_helpers import TH, filled


def test_counters_follow_appends_tiering_eviction_and_deletion() -> None:
    h = TH()
    assert h.counters() == (0, 0)
    h.create("a", OCTET, body=b"12345")
    h.append("a", b"678", ct=OCTET)
    h.create("b", OCTET)
    h.append("b", b"xy", ct=OCTET)
    assert h.counters() == (10, 10) == h.reopened_counters()
    assert h.tier("a", 5).code is Code.OK
    assert h.counters() == (5, 10) == h.reopened_counters()
    assert h.evict("a").code is Code.OK
    assert h.counters() == (5, 5) == h.reopened_counters()
    assert h.tier("a").code is Code.OK
    assert h.tier("b").code is Code.OK
    assert h.counters() == (0, 5) == h.reopened_counters()
    h.append("a", b"9", ct=OCTET)
    assert h.counters() == (1, 6) == h.reopened_counters()
    assert h.fork("f", "a", offset=5).code is Code.CREATED
    assert h.counters() == (1, 6), "a fork owns none of its source's bytes"
    h.append("f", b"ffff", ct=None)
    assert h.counters() == (5, 10) == h.reopened_counters()
    assert h.delete("a").code is Code.DELETED  # soft: the fork still reads it
    assert h.counters() == (5, 10) == h.reopened_counters()
    assert h.delete("f").code is Code.DELETED  # takes the source with it
    assert h.counters() == (0, 2) == h.reopened_counters()
    assert h.delete("b").code is Code.DELETED
    assert h.counters() == (0, 0) == h.reopened_counters()


def test_fork_sub_offset_prefix_counts_as_own_bytes() -> None:
    h = filled()
    assert h.fork("f", "s", offset=5, sub=2).code is Code.CREATED  # own record "cc" at 5
    assert h.counters() == (12, 12) == h.reopened_counters()


def test_counters_after_expiry_collection() -> None:
    h = TH()
    h.create("t", OCTET, body=b"abc", ttl=1)
    h.append("t", b"def", ct=OCTET)
    h.create("keep", OCTET, body=b"zz")
    assert h.tier("t", 3).code is Code.OK
    assert h.evict("t").code is Code.OK
    assert h.counters() == (5, 5)
    h.one(CollectExpired([h.m("t").sid]), now=T0 + 5000)
    assert h.meta("t") is None
    assert h.counters() == (2, 2) == h.reopened_counters()


def test_tiering_and_append_in_one_batch_keep_counters_exact() -> None:
    h = filled()
    out = h.batch(h.segment_cmd("s", 9), Append(B, "s", OCTET, b"zz"))
    assert [o.code for o in out] == [Code.OK, Code.APPENDED]
    assert h.counters() == (3, 12) == h.reopened_counters()
