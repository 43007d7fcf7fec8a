"""TierSegment: recording an uploaded segment, and when a proposal is stale."""

from __future__ import annotations

import msgspec
import pytest

from app.state_machine import records as r
from app.state_machine.commands import Code
from tests.state_machine.helpers import JSON, T0, dump, jrec
from tests.state_machine.tiering_helpers import TH, U32, filled, tier_cmd


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
    before = h.state(but_queue=True)
    assert h.one(cmd).code is Code.STALE, why
    assert h.state(but_queue=True) == before


def test_tier_segment_without_starts_is_stale() -> None:
    h = filled()
    cmd = h.segment_cmd("s", 5)
    cmd.segment = msgspec.structs.replace(cmd.segment, starts=b"")
    before = h.state(but_queue=True)
    assert h.one(cmd).code is Code.STALE
    assert h.state(but_queue=True) == before


def test_tier_segment_for_an_unknown_or_deleted_stream_is_stale() -> None:
    h = filled()
    cmd = h.segment_cmd("s", 5)
    unknown = tier_cmd(999, 0, 5, "b/x/segments/y.parquet", 1, "00", T0, T0, U32.pack(0))
    before = h.state(but_queue=True)
    assert h.one(unknown).code is Code.STALE
    assert h.state(but_queue=True) == before
    assert h.delete("s").code is Code.DELETED
    before = h.state(but_queue=True)
    assert h.one(cmd).code is Code.STALE
    assert h.state(but_queue=True) == before
    # Uploaded for nothing: queued for deletion (the collector keeps what an entry recorded).
    assert cmd.segment.key.encode() in [key for key, _ in dump(h.kv)[r.GC_QUEUE]]


def test_retried_tier_segment_after_success_is_stale() -> None:
    h = filled()
    cmd = h.segment_cmd("s", 5)
    assert h.one(cmd).code is Code.OK
    before = h.state(but_queue=True)
    assert h.one(cmd).code is Code.STALE
    assert h.state(but_queue=True) == before
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
