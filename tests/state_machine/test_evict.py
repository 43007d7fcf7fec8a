"""Evict: dropping local copies of tiered records, and reads of evicted ranges through the cold source."""

from __future__ import annotations

import pytest

from app.state_machine import records as r
from app.state_machine.commands import Code, Evict
from app.tiering import segment as seg
from tests.state_machine.helpers import JSON, B, jrec
from tests.state_machine.tiering_helpers import BIG, TH, filled


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
