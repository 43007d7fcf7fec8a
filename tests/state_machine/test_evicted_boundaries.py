"""Record boundaries over evicted ranges (from segment starts), and forks at and into evicted records."""

from __future__ import annotations

from app.state_machine.commands import Code
from tests.state_machine.helpers import JSON, jrec
from tests.state_machine.tiering_helpers import TH, filled


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
