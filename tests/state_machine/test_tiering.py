"""The state machine's cold-tier rules: TierSegment, Evict, ForgetObjects and reads of evicted ranges.

Segments are built the way the tiering worker builds them (`segment.build` over the committed
records) and kept in a dict; `DictCold` serves them back as the state machine's ColdSource, so
every read of an evicted range goes through a real Parquet round trip.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.raft.messages import Entry
from app.state_machine import records as r
from app.state_machine.commands import (
    Append,
    Code,
    CollectExpired,
    CreateStream,
    DeleteStream,
    Evict,
    ForgetObjects,
    Outcome,
    TierSegment,
)
from app.state_machine.machine import StateMachine, manifest_of
from app.storage.kv import Batch, MemoryKV
from app.tiering import segment as seg
from app.tiering.store import sha256_hex
from tests.state_machine.helpers import T0, B, dump
from tests.state_machine.test_machine import JSON, OCTET, TEXT, H, P, jrec

U32 = struct.Struct(">I")
BIG = 1 << 20
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def tier_cmd(
    sid: int, lo: int, hi: int, key: str, size: int, sha: str, first: int, last: int, starts: bytes
) -> TierSegment:
    return TierSegment(sid, r.SegmentInfo(lo, hi, key, size, sha, first, last, starts))


class DictCold:
    """A ColdSource over Parquet segment objects kept in a dict, with the contract checked on every call."""

    def __init__(self, objects: dict[str, bytes]) -> None:
        self.objects = objects
        self.calls: list[tuple[str, int, int]] = []

    def records(self, segment: r.SegmentInfo, lo: int, hi: int) -> Iterator[tuple[int, memoryview]]:
        assert segment.lo <= lo < hi <= segment.hi, f"asked for [{lo}, {hi}) of segment [{segment.lo}, {segment.hi})"
        self.calls.append((segment.key, lo, hi))
        data = self.objects[segment.key]
        assert (len(data), sha256_hex(data)) == (segment.size, segment.sha256)
        loaded = seg.load(data)
        assert loaded.positions[0] == segment.lo
        for pos, payload in zip(loaded.positions, loaded.payloads, strict=True):
            if pos + len(payload) <= lo or pos >= hi:
                continue
            view = memoryview(payload)
            yield (lo, view[lo - pos :]) if pos < lo else (pos, view)


class TH(H):
    """The state machine harness of test_machine, plus segment building, eviction and cold reads."""

    def __init__(self, kv: MemoryKV | None = None, bucket: str | None = B) -> None:
        super().__init__(kv, bucket=bucket)
        self.objects: dict[str, bytes] = {}
        self.cold = DictCold(self.objects)

    def m(self, name: str) -> r.StreamMeta:
        meta = self.meta(name)
        assert meta is not None, name
        return meta

    def own_records(self, meta: r.StreamMeta, lo: int, hi: int) -> list[seg.Record]:
        out = []
        for key, value in self.kv.scan(r.DATA, r.data_key(meta.sid, lo), r.data_key(meta.sid, hi)):
            payload = bytes(r.record_payload(value))
            out.append(seg.Record(r.data_pos(key), r.record_time(value), payload, r.record_producer(value)))
        return out

    def segment_cmd(self, name: str, hi: int | None = None, lo: int | None = None) -> TierSegment:
        """The TierSegment the worker would propose for records [lo, hi) (default: tiered .. tail)."""
        meta = self.m(name)
        lo = meta.tiered if lo is None else lo
        hi = meta.tail if hi is None else hi
        recs = self.own_records(meta, lo, hi)
        key = seg.segment_key(meta.bucket, meta.name, lo, hi)
        data = seg.build(meta.bucket, meta.name, meta.content_type, recs) if recs else b""
        self.objects[key] = data
        starts = b"".join(U32.pack(rec.pos - lo) for rec in recs)
        times = [rec.time for rec in recs] or [0]
        return tier_cmd(meta.sid, lo, hi, key, len(data), sha256_hex(data), min(times), max(times), starts)

    def tier(self, name: str, hi: int | None = None) -> Outcome:
        return self.one(self.segment_cmd(name, hi))

    def evict(self, name: str, upto: int | None = None) -> Outcome:
        meta = self.m(name)
        return self.one(Evict(meta.sid, meta.tiered if upto is None else upto))

    def cold_parts(
        self, name: str, start: int = 0, max_bytes: int = BIG, sm: StateMachine | None = None
    ) -> list[bytes]:
        sm = sm or self.sm
        meta = sm.lookup(B, name)
        assert meta is not None
        pos, parts = start, []
        while True:
            chunk = sm.read(meta, pos, max_bytes, self.cold)
            parts += [bytes(p) for p in chunk.payloads]
            if chunk.next_pos >= meta.tail:
                assert chunk.next_pos == meta.tail
                return parts
            assert chunk.next_pos > pos, "a read must make progress"
            pos = chunk.next_pos

    def cold_text(self, name: str, start: int = 0, max_bytes: int = BIG) -> bytes:
        return b"".join(self.cold_parts(name, start, max_bytes))

    def cold_json(self, name: str, start: int = 0, max_bytes: int = BIG) -> list:
        return json.loads(b"[" + b",".join(self.cold_parts(name, start, max_bytes)) + b"]")

    def local_positions(self, name: str) -> list[int]:
        sid = self.m(name).sid
        return [r.data_pos(k) for k, _ in self.kv.scan(r.DATA, r.data_key(sid, 0), r.data_key(sid + 1, 0))]

    def gc_queue(self) -> set[str]:
        return {k.decode() for k, _ in self.kv.scan(r.GC_QUEUE, b"")}

    def counters(self) -> tuple[int, int]:
        return self.sm.untiered_bytes, self.sm.local_bytes

    def reopened_counters(self) -> tuple[int, int]:
        again = StateMachine(self.kv)
        return again.untiered_bytes, again.local_bytes

    def state(self) -> tuple:
        """Everything a rejected command must leave alone (the applied index aside)."""
        kv = dump(self.kv)
        kv.pop(r.SM_META)
        metas = {sid: r.encode(meta) for sid, meta in self.sm.streams.items()}
        return kv, metas, self.counters()


@pytest.fixture()
def h() -> TH:
    return TH()


def filled(name: str = "s", payloads: tuple[bytes, ...] = (b"aaa", b"bb", b"cccc", b"d"), ct: str = OCTET) -> TH:
    """A harness with one stream holding the given records (starts 0, 3, 5, 9; tail 10 by default)."""
    h = TH()
    assert h.create(name, ct).code is Code.CREATED
    for p in payloads:
        assert h.append(name, p, ct=ct).code is Code.APPENDED
    return h


def replay(batches: list[list[Entry]]) -> tuple[MemoryKV, list]:
    kv = MemoryKV(r.COLUMN_FAMILIES)
    sm = StateMachine(kv)
    outcomes = [o for batch in batches for o in sm.apply(batch)]
    return kv, outcomes


# TierSegment


def test_tier_segment_at_a_boundary_is_recorded() -> None:
    h = filled()
    cmd = h.segment_cmd("s", 5)
    out = h.one(cmd)
    assert out.code is Code.OK and out.sid == cmd.sid and out.next_pos == 5
    meta = h.m("s")
    assert (meta.tiered, meta.evicted, meta.tail) == (5, 0, 10)
    raw = h.kv.get(r.SEGMENTS, r.data_key(meta.sid, 0))
    assert raw is not None
    info = r.decode_segment(raw)
    assert info == r.SegmentInfo(
        0, 5, cmd.segment.key, cmd.segment.size, cmd.segment.sha256, T0, T0, U32.pack(0) + U32.pack(3)
    )
    assert info.records == 2
    assert h.kv.get(r.STREAMS, r.sid_key(meta.sid)) == r.encode(meta), "the new tiered mark is persisted"
    assert list(h.sm.segments(meta.sid, 0, meta.tail)) == [info]
    assert h.sm.segment_at(meta.sid, 4) == info and h.sm.segment_at(meta.sid, 5) is None
    assert h.local_positions("s") == [0, 3, 5, 9], "tiering alone keeps the local copy"


def test_consecutive_segments_and_the_whole_tail() -> None:
    h = filled()
    assert h.tier("s", 3).code is Code.OK
    assert h.tier("s", 9).code is Code.OK
    assert h.tier("s").code is Code.OK  # up to the tail
    meta = h.m("s")
    assert meta.tiered == meta.tail == 10
    assert [(s.lo, s.hi, s.records) for s in h.sm.segments(meta.sid, 0, 10)] == [(0, 3, 1), (3, 9, 2), (9, 10, 1)]
    assert [s.lo for s in h.sm.segments(meta.sid, 4, 9)] == [3], "segments() returns only overlapping ones"
    assert h.tier("s", 10).code is Code.STALE, "nothing left to tier"


@pytest.mark.parametrize(
    ("lo", "hi", "why"),
    [
        (0, 4, "hi inside a record"),
        (0, 1, "hi inside the first record"),
        (0, 11, "hi past the tail"),
        (0, 0, "empty range"),
        (3, 5, "lo is not where tiering stands"),
        (5, 3, "hi below lo"),
    ],
)
def test_tier_segment_is_stale_unless_lo_is_tiered_and_hi_a_boundary_within_the_tail(
    lo: int, hi: int, why: str
) -> None:
    h = filled()
    cmd = h.segment_cmd("s", hi, lo)
    cmd.segment = msgspec.structs.replace(cmd.segment, starts=cmd.segment.starts or U32.pack(0))
    before = h.state()
    assert h.one(cmd).code is Code.STALE, why
    assert h.state() == before


def test_tier_segment_without_starts_is_stale() -> None:
    h = filled()
    cmd = h.segment_cmd("s", 5)
    cmd.segment = msgspec.structs.replace(cmd.segment, starts=b"")
    before = h.state()
    assert h.one(cmd).code is Code.STALE
    assert h.state() == before


def test_tier_segment_for_an_unknown_or_deleted_stream_is_stale() -> None:
    h = filled()
    cmd = h.segment_cmd("s", 5)
    unknown = tier_cmd(999, 0, 5, "b/x/segments/y.parquet", 1, "00", T0, T0, U32.pack(0))
    before = h.state()
    assert h.one(unknown).code is Code.STALE
    assert h.state() == before
    assert h.delete("s").code is Code.DELETED
    before = h.state()
    assert h.one(cmd).code is Code.STALE
    assert h.state() == before


def test_retried_tier_segment_after_success_is_stale() -> None:
    h = filled()
    cmd = h.segment_cmd("s", 5)
    assert h.one(cmd).code is Code.OK
    before = h.state()
    assert h.one(cmd).code is Code.STALE
    assert h.state() == before
    assert h.counters() == (5, 10)


def test_tier_segment_of_a_json_stream_needs_a_record_boundary() -> None:
    h = TH()
    h.create("j", JSON)
    h.append("j", jrec(1, 2), ct=JSON)  # "1,2" at 0
    h.append("j", jrec("x"), ct=JSON)  # '"x"' at 3
    assert h.tier("j", 1).code is Code.STALE, "a message boundary inside a record is not a record boundary"
    assert h.tier("j", 3).code is Code.OK
    assert h.m("j").tiered == 3


def test_fork_tiering_starts_at_its_fork_point() -> None:
    h = filled()
    assert h.fork("f", "s", offset=5).code is Code.CREATED
    assert h.append("f", b"XYZ", ct=None).code is Code.APPENDED
    fork = h.m("f")
    assert (fork.tiered, fork.evicted) == (5, 5)
    assert h.one(h.segment_cmd("f", 8, lo=0)).code is Code.STALE, "positions below the fork belong to the source"
    assert h.tier("f").code is Code.OK
    assert h.m("f").tiered == 8
    assert [(s.lo, s.hi) for s in h.sm.segments(fork.sid, 0, 8)] == [(5, 8)]
    assert h.m("s").tiered == 0, "the source is not tiered by its fork"


# Counters


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


# Evict


def test_evict_drops_local_records_below_a_segment_end() -> None:
    h = filled()
    h.tier("s", 3)
    h.tier("s", 9)
    sid = h.m("s").sid
    out = h.evict("s", 3)
    assert out.code is Code.OK and out.sid == sid and out.next_pos == 3
    assert h.local_positions("s") == [3, 5, 9]
    assert h.m("s").evicted == 3
    assert h.evict("s", 9).code is Code.OK
    assert h.local_positions("s") == [9]
    meta = h.m("s")
    assert (meta.tiered, meta.evicted) == (9, 9)
    assert h.kv.get(r.STREAMS, r.sid_key(sid)) == r.encode(meta)
    assert len(list(h.sm.segments(sid, 0, 10))) == 2, "eviction keeps the segments"


def test_evict_several_segments_at_once() -> None:
    h = filled()
    h.tier("s", 3)
    h.tier("s", 9)
    assert h.evict("s", 9).code is Code.OK
    assert h.local_positions("s") == [9]
    assert h.counters() == (1, 1)


@pytest.mark.parametrize(
    ("upto", "why"),
    [
        (10, "beyond what is tiered"),
        (5, "a record boundary inside a segment, not its end"),
        (4, "inside a record"),
        (0, "nothing"),
    ],
)
def test_evict_is_stale_unless_upto_is_a_segment_end_within_tiered(upto: int, why: str) -> None:
    h = filled()
    h.tier("s", 9)
    before = h.state()
    assert h.evict("s", upto).code is Code.STALE, why
    assert h.state() == before


def test_evict_retried_or_for_unknown_stream_is_stale() -> None:
    h = filled()
    h.tier("s", 3)
    h.tier("s", 9)
    assert h.evict("s", 9).code is Code.OK
    before = h.state()
    assert h.evict("s", 9).code is Code.STALE, "a retry"
    assert h.evict("s", 3).code is Code.STALE, "moving back"
    assert h.one(Evict(999, 3)).code is Code.STALE
    assert h.state() == before


def test_reading_evicted_records_needs_a_cold_source() -> None:
    h = filled()
    h.tier("s", 5)
    h.evict("s")
    meta = h.m("s")
    with pytest.raises(LookupError):
        h.sm.read(meta, 0, BIG)
    with pytest.raises(LookupError):
        h.sm.read(meta, 4, BIG)
    chunk = h.sm.read(meta, 5, BIG)  # the local part needs none
    assert b"".join(chunk.payloads) == b"ccccd" and chunk.next_pos == 10


def test_cold_reads_are_byte_identical_to_reads_before_eviction() -> None:
    h = filled(payloads=(b"\x00\xff\x01", b"bb", b"cccc", b"d", b"\x80" * 7))
    content = h.text("s")
    before = {(start, mb): h.parts("s", start, mb) for start in range(len(content) + 1) for mb in (1, 2, 3, 5, BIG)}
    h.tier("s", 3)
    h.tier("s", 9)
    h.tier("s", 10)
    assert h.evict("s", 9).code is Code.OK
    h.cold.calls.clear()
    for (start, mb), parts in before.items():
        assert h.cold_parts("s", start, mb) == parts, (start, mb)
    assert h.cold.calls, "the evicted range came from the cold source"
    assert {c[0] for c in h.cold.calls} == {seg.segment_key(B, "s", 0, 3), seg.segment_key(B, "s", 3, 9)}


def test_read_from_mid_record_in_an_evicted_range_and_across_to_local_records() -> None:
    h = filled()
    h.tier("s", 9)
    h.evict("s")
    meta = h.m("s")
    chunk = h.sm.read(meta, 1, BIG, h.cold)
    assert [bytes(p) for p in chunk.payloads] == [b"aa", b"bb", b"cccc", b"d"]
    assert chunk.next_pos == 10
    chunk = h.sm.read(meta, 6, 4, h.cold)
    assert [bytes(p) for p in chunk.payloads] == [b"ccc", b"d"] and chunk.next_pos == 10
    chunk = h.sm.read(meta, 2, 4, h.cold)
    assert [bytes(p) for p in chunk.payloads] == [b"a", b"bb", b"c"] and chunk.next_pos == 6
    assert h.cold.calls[-1] == (seg.segment_key(B, "s", 0, 9), 2, 9)


def test_json_stream_read_at_boundaries_after_eviction() -> None:
    h = TH()
    h.create("j", JSON)
    recs = [jrec(1, {"a": [1, 2]}), jrec("x,y"), jrec(None, True, 3.5), jrec([])]
    for rec in recs:
        h.append("j", rec, ct=JSON)
    values = h.json("j")
    starts = [0]
    for rec in recs:
        starts.append(starts[-1] + len(rec))
    before = {(s, mb): h.parts("j", s, mb) for s in starts for mb in (1, 10, BIG)}
    assert h.tier("j", starts[2]).code is Code.OK
    assert h.tier("j", starts[3]).code is Code.OK
    assert h.evict("j").code is Code.OK
    assert h.local_positions("j") == [starts[3]]
    assert h.cold_json("j") == values
    for (s, mb), parts in before.items():
        assert h.cold_parts("j", s, mb) == parts, (s, mb)
    chunk = h.sm.read(h.m("j"), 0, 10, h.cold)
    assert [bytes(p) for p in chunk.payloads] == recs[:1], "a JSON read returns whole records"


def test_fork_reads_its_sources_evicted_ranges() -> None:
    h = filled()
    assert h.fork("early", "s", offset=9).code is Code.CREATED  # forked before eviction
    h.append("early", b"E", ct=None)
    h.tier("s", 5)
    h.tier("s", 10)
    assert h.evict("s").code is Code.OK
    assert h.fork("late", "s", offset=5).code is Code.CREATED  # forked after
    h.append("late", b"LL", ct=None)
    assert h.fork("grand", "late", offset=7).code is Code.CREATED
    h.append("grand", b"G", ct=None)
    assert h.cold_text("early") == b"aaabbccccE"
    assert h.cold_text("late") == b"aaabbLL"
    assert h.cold_text("grand") == b"aaabbLLG"
    assert h.cold_text("grand", 4) == b"bLLG"
    with pytest.raises(LookupError):
        h.sm.read(h.m("early"), 0, BIG)
    chunk = h.sm.read(h.m("early"), 9, BIG)
    assert b"".join(chunk.payloads) == b"E", "the fork's own records are local"


def test_evicted_fork_over_an_evicted_source() -> None:
    h = filled()
    h.tier("s")
    h.evict("s")
    assert h.fork("f", "s", offset=9).code is Code.CREATED
    h.append("f", b"12", ct=None)
    h.append("f", b"345", ct=None)
    assert h.tier("f", 11).code is Code.OK
    assert h.evict("f").code is Code.OK
    assert h.local_positions("f") == [11]
    assert h.cold_text("f") == b"aaabbcccc12345"
    assert h.cold_text("f", 10) == b"2345"
    assert h.cold_text("f", 4) == b"bcccc12345"


# Boundaries over evicted ranges


def test_is_boundary_on_evicted_positions_uses_segment_starts() -> None:
    h = filled()
    expected = {p: p in (0, 3, 5, 9, 10) for p in range(11)}
    assert {p: h.sm.is_boundary(h.m("s"), p) for p in range(11)} == expected
    h.tier("s", 5)
    h.tier("s", 9)
    h.evict("s")
    assert h.local_positions("s") == [9]
    assert {p: h.sm.is_boundary(h.m("s"), p) for p in range(11)} == expected


def test_fork_at_an_evicted_boundary_is_the_same_as_before_eviction() -> None:
    plain = filled()
    evicted = filled()
    evicted.tier("s", 9)
    evicted.evict("s")
    for h in (plain, evicted):
        assert h.fork("f3", "s", offset=3).code is Code.CREATED
        assert h.fork("f0", "s", offset=0).code is Code.CREATED
        assert h.fork("bad", "s", offset=4).code is Code.BAD_FORK_OFFSET
        assert h.fork("bad", "s", offset=6).code is Code.BAD_FORK_OFFSET
        assert h.m("f3").fork_pos == 3 and h.m("s").forks == 2
    assert evicted.cold_text("f3") == plain.text("f3") == b"aaa"
    assert evicted.cold_text("f0") == plain.text("f0") == b""


def test_fork_through_a_fork_at_the_sources_evicted_boundary() -> None:
    h = filled()
    h.fork("f", "s")  # at the tail, 10
    h.tier("s", 9)
    h.evict("s")
    assert h.fork("g", "f", offset=5).code is Code.CREATED
    assert h.fork("bad", "f", offset=7).code is Code.BAD_FORK_OFFSET
    assert h.cold_text("g") == b"aaabb"


def test_fork_with_sub_offset_into_an_evicted_record_takes_the_record_the_proposer_fetched() -> None:
    plain = filled()
    evicted = filled()
    evicted.tier("s", 9)
    evicted.evict("s")
    for offset, sub, record, expected in [(5, 2, b"cccc", b"aaabbcc"), (0, 3, b"aaa", b"aaa"), (3, 1, b"bb", b"aaab")]:
        name = f"f{offset}"
        assert plain.fork(name, "s", offset=offset, sub=sub).code is Code.CREATED
        assert plain.text(name) == expected
        out = evicted.fork(name, "s", offset=offset, sub=sub, evicted_record=record)
        assert out.code is Code.CREATED, out
        assert evicted.cold_text(name) == expected
        assert plain.counters()[0] - evicted.counters()[0] == 9, "the fork's prefix record is its own in both"
    assert evicted.cold_text("f5", 5) == b"cc"


def test_fork_with_sub_offset_into_an_evicted_record_needs_a_record_of_the_right_length() -> None:
    h = filled()
    h.tier("s", 9)
    h.evict("s")
    before = h.state()
    for record in (None, b"ccc", b"ccccc", b""):
        out = h.fork("f", "s", offset=5, sub=2, evicted_record=record)
        assert out.code is Code.BAD_SUB_OFFSET, record
    assert h.fork("f", "s", offset=5, sub=5, evicted_record=b"cccc").code is Code.BAD_SUB_OFFSET, "sub past the record"
    assert h.fork("f", "s", offset=4, sub=1, evicted_record=b"b").code is Code.BAD_FORK_OFFSET
    assert h.state() == before, "rejected forks keep no reference and write nothing"
    assert h.m("s").forks == 0


def test_fork_sub_offset_into_a_local_record_ignores_an_evicted_record() -> None:
    h = filled()
    h.tier("s", 5)
    h.evict("s")
    assert h.fork("f", "s", offset=5, sub=2, evicted_record=b"XXXX").code is Code.CREATED
    assert h.cold_text("f") == b"aaabbcc", "the local record wins"


def test_fork_sub_offset_through_a_fork_into_the_sources_evicted_record() -> None:
    h = TH()
    h.create("j", JSON)
    h.append("j", jrec(1, 2, 3), ct=JSON)  # "1,2,3" at 0
    h.append("j", jrec("x"), ct=JSON)  # at 5
    h.fork("mid", "j")  # at the tail, 8
    h.tier("j", 5)
    h.evict("j")
    assert h.fork("g", "mid", offset=0, sub=2, ct=JSON).code is Code.BAD_SUB_OFFSET
    out = h.fork("g", "mid", offset=0, sub=2, ct=JSON, evicted_record=jrec(1, 2, 3))
    assert out.code is Code.CREATED, out
    assert h.cold_json("g") == [1, 2]


# Deletion queue


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


# Producer info in records


def test_records_keep_the_producer_that_appended_them() -> None:
    h = TH()
    h.create("s", TEXT, body=b"init")
    h.append("s", b"plain")
    h.append("s", b"prod", producer=P(3, 0, "prod-ü"))
    h.append("s", b"next", producer=P(3, 1, "prod-ü"))
    h.fork("f", "s", offset=4, sub=2, ct=TEXT)  # a prefix record copied by the fork
    sid = h.m("s").sid
    rows = {r.data_pos(k): v for k, v in h.kv.scan(r.DATA, r.data_key(sid, 0), r.data_key(sid + 1, 0))}
    assert [bytes(r.record_payload(v)) for v in rows.values()] == [b"init", b"plain", b"prod", b"next"]
    assert [r.record_producer(v) for v in rows.values()] == [None, None, ("prod-ü", 3, 0), ("prod-ü", 3, 1)]
    assert all(r.record_time(v) == T0 for v in rows.values())
    fork_rows = list(h.kv.scan(r.DATA, r.data_key(h.m("f").sid, 0), r.data_key(h.m("f").sid + 1, 0)))
    assert [(bytes(r.record_payload(v)), r.record_producer(v)) for _, v in fork_rows] == [(b"pl", None)]
    assert h.text("s") == b"initplainprodnext"


def test_producer_record_encoding_round_trip() -> None:
    for producer in [("p", 0, 0), ("", 2**63 - 1, 2**63 - 1), ("x" * 300, 7, 9), ("日本", 1, 2)]:
        raw = r.encode_record(T0 + 1, b"payload", producer)
        assert raw[0] == 2
        assert r.record_producer(raw) == producer
        assert bytes(r.record_payload(raw)) == b"payload"
        assert r.record_time(raw) == T0 + 1
    raw = r.encode_record(T0, b"")
    assert r.record_producer(raw) is None and bytes(r.record_payload(raw)) == b""


def test_v1_records_still_decode_and_read() -> None:
    v1 = struct.pack(">BQ", 1, T0 + 7) + b"old bytes"
    assert r.encode_record(T0 + 7, b"old bytes") == v1
    assert bytes(r.record_payload(v1)) == b"old bytes"
    assert r.record_producer(v1) is None
    assert r.record_time(v1) == T0 + 7
    # A store written before the producer was kept: v1 records beside v2 ones.
    h = TH()
    h.create("s", TEXT)
    h.append("s", b"new", producer=P(0, 0))
    batch = Batch()
    batch.put(r.DATA, r.data_key(h.m("s").sid, 0), struct.pack(">BQ", 1, T0) + b"new")
    h.kv.write(batch)
    old = TH(h.kv, bucket=None)  # restarted over the old-format record
    raw = h.kv.get(r.DATA, r.data_key(h.m("s").sid, 0))
    assert raw is not None and r.record_producer(raw) is None
    assert old.text("s") == b"new"
    old.append("s", b"+", ct=TEXT)
    assert old.text("s") == b"new+"
    assert old.tier("s").code is Code.OK
    assert old.evict("s").code is Code.OK
    assert old.cold_text("s") == b"new+"


# Determinism


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


# Random workloads against a plain bytes model


@st.composite
def plans(draw: st.DrawFn) -> tuple[list[bytes], list[int], int]:
    """Records, the record indexes segments end at (increasing), and how many segments to evict."""
    recs = draw(st.lists(st.binary(min_size=1, max_size=9), min_size=1, max_size=12))
    cuts = sorted(draw(st.sets(st.integers(1, len(recs)), max_size=4)))
    return recs, cuts, draw(st.integers(0, len(cuts)))


def starts_of(sizes: list[int]) -> list[int]:
    out = [0]
    for n in sizes:
        out.append(out[-1] + n)
    return out


@FAST
@given(plan=plans(), data=st.data())
def test_random_tiering_and_eviction_read_like_a_bytes_model(plan: tuple[list[bytes], list[int], int], data) -> None:
    recs, cuts, evicted_segments = plan
    h = TH()
    h.create("s", OCTET)
    for p in recs:
        h.append("s", p, ct=OCTET)
    content = b"".join(recs)
    bounds = starts_of([len(p) for p in recs])
    for c in cuts:
        assert h.tier("s", bounds[c]).code is Code.OK
    tiered = bounds[cuts[-1]] if cuts else 0
    evicted = bounds[cuts[evicted_segments - 1]] if evicted_segments else 0
    if evicted:
        assert h.evict("s", evicted).code is Code.OK
    meta = h.m("s")
    assert (meta.tiered, meta.evicted, meta.tail) == (tiered, evicted, len(content))
    assert h.local_positions("s") == [b for b in bounds[:-1] if b >= evicted]
    assert h.counters() == (len(content) - tiered, len(content) - evicted) == h.reopened_counters()
    assert [p for p in range(len(content) + 1) if h.sm.is_boundary(meta, p)] == bounds
    for _ in range(4):
        start = data.draw(st.integers(0, len(content)), label="start")
        max_bytes = data.draw(st.integers(1, len(content) + 1), label="max_bytes")
        chunk = h.sm.read(meta, start, max_bytes, h.cold)
        assert b"".join(chunk.payloads) == content[start : start + max_bytes]
        assert chunk.next_pos == min(len(content), start + max_bytes)
        assert h.cold_text("s", start, max_bytes) == content[start:]
    if evicted:
        with pytest.raises(LookupError):
            h.sm.read(meta, data.draw(st.integers(0, evicted - 1), label="cold start"), BIG)
    assert b"".join(h.sm.read(meta, evicted, BIG).payloads) == content[evicted:]
    at = data.draw(st.sampled_from(bounds), label="fork at")
    assert h.fork("f", "s", offset=at).code is Code.CREATED
    h.append("f", b"<fork>", ct=None)
    assert h.cold_text("f") == content[:at] + b"<fork>"
    again = StateMachine(h.kv)
    assert h.cold_parts("f", sm=again) == h.cold_parts("f")
    kv, _ = replay(h.batches)
    assert dump(kv) == dump(h.kv)
    # Deleting both (the source goes with its last fork) leaves nothing counted and every object queued.
    assert h.delete("s").code is Code.DELETED and h.gc_queue() == set()
    assert h.delete("f").code is Code.DELETED
    assert h.counters() == (0, 0) == h.reopened_counters()
    segments = {seg.segment_key(B, "s", bounds[a], bounds[b]) for a, b in zip([0, *cuts], cuts, strict=False)}
    assert h.gc_queue() == (segments | {seg.manifest_key(B, "s")} if cuts else set())
    assert dump(h.kv)[r.SEGMENTS] == dump(h.kv)[r.DATA] == []


json_values = st.one_of(st.integers(-99, 99), st.text('ab,"\\', max_size=3), st.lists(st.booleans(), max_size=2))


@FAST
@given(
    recs=st.lists(st.lists(json_values, min_size=1, max_size=3), min_size=1, max_size=8),
    data=st.data(),
)
def test_random_json_tiering_reads_whole_records_at_boundaries(recs: list[list], data) -> None:
    h = TH()
    h.create("j", JSON)
    encoded = [jrec(*values) for values in recs]
    for rec in encoded:
        assert h.append("j", rec, ct=JSON).code is Code.APPENDED
    bounds = starts_of([len(e) for e in encoded])
    cuts = sorted(data.draw(st.sets(st.integers(1, len(recs)), min_size=1, max_size=3), label="cuts"))
    for c in cuts:
        assert h.tier("j", bounds[c]).code is Code.OK
    evict_to = bounds[data.draw(st.sampled_from(cuts), label="evict")]
    assert h.evict("j", evict_to).code is Code.OK
    meta = h.m("j")
    assert [p for p in range(meta.tail + 1) if h.sm.is_boundary(meta, p)] == bounds
    assert h.cold_json("j") == [v for values in recs for v in values]
    i = data.draw(st.integers(0, len(recs) - 1), label="start record")
    max_bytes = data.draw(st.integers(1, 40), label="max_bytes")
    chunk = h.sm.read(meta, bounds[i], max_bytes, h.cold)
    expected = [encoded[i]]
    for rec in encoded[i + 1 :]:
        if sum(map(len, expected)) + len(rec) > max_bytes:
            break
        expected.append(rec)
    assert [bytes(p) for p in chunk.payloads] == expected
    assert chunk.next_pos == bounds[i + len(expected)]


def test_tiering_and_append_in_one_batch_keep_counters_exact() -> None:
    h = filled()
    out = h.batch(h.segment_cmd("s", 9), Append(B, "s", OCTET, b"zz"))
    assert [o.code for o in out] == [Code.OK, Code.APPENDED]
    assert h.counters() == (3, 12) == h.reopened_counters()
