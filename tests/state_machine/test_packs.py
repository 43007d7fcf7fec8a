"""Packs in the state machine: TierPack takes each slice as TierSegment would, PACKS counts the live
slices, and releasing the last one (delete, retention, merge) queues the pack and its index."""

from __future__ import annotations

import msgspec

from app.state_machine import records as r
from app.state_machine.cold_tier import pack_index_of
from app.state_machine.commands import Code, ForgetObjects, MergeSegments, Retain, TierPack
from app.state_machine.machine import StateMachine
from tests.state_machine.helpers import OCTET, B, dump
from tests.state_machine.tiering_helpers import TH


def two_streams() -> TH:
    h = TH()
    for name, parts in (("a", (b"aa", b"aaa")), ("b", (b"bbbb",))):
        h.create(name, OCTET)
        for part in parts:
            assert h.append(name, part, ct=OCTET).code is Code.APPENDED
    return h


def test_a_pack_tiers_every_slice_and_reads_back_after_eviction() -> None:
    h = two_streams()
    cmd = h.pack_cmd("a", "b")
    assert h.one(cmd).next_pos == 2
    info = h.sm.pack(cmd.key)
    assert info is not None and (info.live, info.slices, info.size) == (2, 2, cmd.size)
    assert sorted(h.sm.pack_slices(cmd.key)) == [(h.m("a").sid, 0), (h.m("b").sid, 0)]
    for name in ("a", "b"):
        segment = h.sm.segment_at(h.m(name).sid, 0)
        assert segment is not None and segment.packed and segment.key == cmd.key and segment.sha256 == cmd.sha256
        assert h.m(name).tiered == h.m(name).tail
        assert h.evict(name).code is Code.OK
    assert h.cold_text("a") == b"aaaaa" and h.cold_text("b") == b"bbbb"
    assert h.cold_parts("a", start=1) == [b"a", b"aaa"]
    assert h.counters() == h.reopened_counters() == (0, 0)


def test_slices_whose_stream_moved_on_are_left_out_and_an_empty_pack_is_queued() -> None:
    h = two_streams()
    cmd = h.pack_cmd("a", "b")
    h.tier("b")  # b was tiered on its own meanwhile
    assert h.one(cmd).next_pos == 1
    assert h.sm.pack(cmd.key).live == 1  # type: ignore[union-attr]
    assert h.sm.segment_at(h.m("b").sid, 0).packed is False  # type: ignore[union-attr]

    again = two_streams()
    stale = again.pack_cmd("a", "b")
    again.tier("a")
    again.tier("b")
    assert again.one(stale).next_pos == 0
    assert {stale.key, pack_index_of(stale.key)} <= again.gc_queue()


def test_a_retried_pack_keeps_what_the_first_recorded() -> None:
    h = two_streams()
    cmd = h.pack_cmd("a", "b")
    h.one(cmd)
    assert h.one(cmd).next_pos == 0  # every slice is stale now
    assert h.sm.pack(cmd.key).live == 2  # type: ignore[union-attr]
    assert not h.gc_queue()


def test_deleting_the_streams_releases_the_pack_only_with_the_last_slice() -> None:
    h = two_streams()
    cmd = h.pack_cmd("a", "b")
    h.one(cmd)
    h.delete("a")
    assert h.sm.pack(cmd.key).live == 1 and not h.gc_queue()  # type: ignore[union-attr]
    assert list(h.sm.pack_slices(cmd.key)) == [(h.m("b").sid, 0)]
    h.delete("b")
    assert h.gc_queue() == {cmd.key, pack_index_of(cmd.key)}
    assert list(h.sm.pack_slices(cmd.key)) == []
    h.one(ForgetObjects([cmd.key, pack_index_of(cmd.key)]))
    assert h.sm.pack(cmd.key) is None and not h.gc_queue()


def test_retention_past_a_slice_releases_it() -> None:
    h = two_streams()
    cmd = h.pack_cmd("a", "b")
    h.one(cmd)
    h.append("a", b"later", ct=OCTET)
    h.tier("a")
    assert h.one(Retain(B, "a", 5)).code is Code.OK
    assert h.sm.pack(cmd.key).live == 1  # type: ignore[union-attr]
    assert h.sm.segment_at(h.m("a").sid, 0) is None


def test_a_merge_replaces_small_segments_and_releases_their_packs() -> None:
    h = TH()
    h.create("a", OCTET)
    h.create("b", OCTET)
    keys = []
    for i in range(3):
        h.append("a", b"x" * (i + 1), ct=OCTET)
        h.append("b", b"y", ct=OCTET)
        cmd = h.pack_cmd("a", "b")
        h.one(cmd)
        keys.append(cmd.key)
    assert h.one(h.merge_cmd("a", 0, 6)).code is Code.OK
    merged = list(h.sm.segments(h.m("a").sid, 0, 6))
    assert len(merged) == 1 and not merged[0].packed and merged[0].record_starts() == [0, 1, 3]
    assert [h.sm.pack(k).live for k in keys] == [1, 1, 1]  # type: ignore[union-attr]
    h.evict("a")
    assert h.cold_text("a") == b"xxxxxx"
    h.delete("b")
    assert h.gc_queue() >= {k for key in keys for k in (key, pack_index_of(key))}


def test_a_merge_that_does_not_match_the_segments_is_stale() -> None:
    h = TH()
    h.create("a", OCTET)
    h.create("b", OCTET)
    for _ in range(2):
        h.append("a", b"xy", ct=OCTET)
        h.append("b", b"z", ct=OCTET)
        h.one(h.pack_cmd("a", "b"))
    good = h.merge_cmd("a", 0, 4)
    before_but_queue = h.state(but_queue=True)
    wrong_starts = MergeSegments(good.sid, msgspec.structs.replace(good.segment, starts=r.encode_starts(0, [0, 1, 2])))
    part = h.merge_cmd("a", 0, 2)  # one segment alone is not a merge
    past = MergeSegments(good.sid, msgspec.structs.replace(good.segment, hi=6))
    for cmd in (wrong_starts, part, past):
        assert h.one(cmd).code is Code.STALE
        assert h.state(but_queue=True) == before_but_queue
        assert cmd.segment.key.encode() in [key for key, _ in dump(h.kv)[r.GC_QUEUE]]  # uploaded for nothing


def test_a_pack_for_another_bucket_takes_nothing() -> None:
    h = two_streams()
    cmd = h.pack_cmd("a", "b")
    foreign = TierPack("elsewhere", "elsewhere/!packs/x.parquet", cmd.size, cmd.sha256, cmd.slices)
    not_a_pack = TierPack(B, f"{B}/a/segments/x.parquet", cmd.size, cmd.sha256, cmd.slices)
    before = h.state()
    assert h.one(foreign).next_pos == 0
    assert h.one(not_a_pack).code is Code.STALE and h.m("a").tiered == 0
    assert h.state()[1] == before[1]


def test_packs_apply_the_same_on_every_replica_and_after_a_restart() -> None:
    def run() -> TH:
        h = two_streams()
        h.one(h.pack_cmd("a", "b"))
        h.append("a", b"more", ct=OCTET)
        h.one(h.pack_cmd("a", "b")) if h.m("b").tail > h.m("b").tiered else h.tier("a")
        h.one(h.merge_cmd("a", 0, 9))
        h.delete("b")
        return h

    first, second = run(), run()
    assert dump(first.kv) == dump(second.kv)
    reopened = StateMachine(first.kv)
    assert list(reopened.packs()) == list(first.sm.packs())
    assert [info.live for _, info in reopened.packs()] == [0]  # a's slice merged away, b deleted
