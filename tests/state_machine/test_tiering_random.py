"""Random tiering and eviction workloads read like a plain bytes model (Hypothesis)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.state_machine import records as r
from app.state_machine.commands import Code
from app.state_machine.machine import StateMachine
from app.tiering import segment as seg
from tests.state_machine.helpers import JSON, OCTET, B, dump, jrec
from tests.state_machine.tiering_helpers import BIG, TH, replay

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


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
