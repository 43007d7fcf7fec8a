"""Automatic retention's target: where a stream's history may start under its max-age and max-bytes.

A fork's history below its fork point is its source's records, which count by their own times and
sizes: a fork with a max-age must not lose young inherited history on the sweep's first look.
"""

from __future__ import annotations

from app.state_machine import records as r
from app.state_machine.commands import DeleteStream, Retain
from app.state_machine.machine import StateMachine
from app.tiering.retention import retention_target
from tests.state_machine.helpers import OCTET, T0, B
from tests.state_machine.tiering_helpers import TH

HOUR_MS = 3_600_000


def _source() -> TH:
    """`src`: four records of 10 bytes, appended an hour apart from T0."""
    h = TH()
    h.create("src", OCTET)
    for i in range(4):
        h.append("src", b"%d" % i * 10, ct=OCTET, now=T0 + i * HOUR_MS)
    return h


def test_a_young_fork_keeps_its_young_inherited_history() -> None:
    h = _source()
    h.fork("fork", "src", retention_age=2 * 3600, now=T0 + 3 * HOUR_MS)
    fork = h.m("fork")
    assert fork.fork_pos == 40 and fork.earliest == 0
    # At T0+3h only the record of T0 is more than two hours old: history starts at 10.
    assert retention_target(h.sm, fork, T0 + 3 * HOUR_MS) == 10
    # Nothing is older than two hours at T0+1h: nothing to retain (the fork point was the answer before).
    assert retention_target(h.sm, fork, T0 + HOUR_MS) is None


def test_a_fork_by_size_counts_its_inherited_bytes_and_stops_at_their_boundaries() -> None:
    h = _source()
    h.fork("fork", "src", retention_bytes=25, now=T0 + 3 * HOUR_MS)
    fork = h.m("fork")
    assert retention_target(h.sm, fork, T0 + 3 * HOUR_MS) == 20  # the boundary at or after 40 - 25
    h.append("fork", b"x" * 10, ct=OCTET, now=T0 + 4 * HOUR_MS)
    assert retention_target(h.sm, h.m("fork"), T0 + 4 * HOUR_MS) == 30
    h.append("fork", b"y" * 10, ct=OCTET, now=T0 + 4 * HOUR_MS)
    assert retention_target(h.sm, h.m("fork"), T0 + 4 * HOUR_MS) == 40  # at its own first record


def test_a_fork_retained_into_its_inherited_history_reads_from_there_and_its_source_keeps_its_bytes() -> None:
    h = _source()
    h.fork("fork", "src", retention_age=2 * 3600, now=T0 + 3 * HOUR_MS)
    assert h.one(Retain(B, "fork", 20, auto=True)).code.value == "ok"
    assert h.m("fork").earliest == 20
    assert h.text("fork", 20) == b"2" * 10 + b"3" * 10
    assert h.text("src") == b"".join(b"%d" % i * 10 for i in range(4))  # the source's bytes stay


def test_inherited_history_in_the_object_store_counts_by_its_segments_times() -> None:
    h = _source()
    h.tier("src", 20)
    h.evict("src", 20)
    h.fork("fork", "src", retention_age=2 * 3600, now=T0 + 3 * HOUR_MS)
    fork = h.m("fork")
    # The segment [0, 20) holds records of T0 and T0+1h: both older than two hours at T0+3h.
    assert retention_target(h.sm, fork, T0 + 3 * HOUR_MS + 1) == 20
    assert retention_target(h.sm, fork, T0 + 2 * HOUR_MS) is None  # the segment's newest is young


def test_a_source_segment_straddling_the_fork_point_counts_by_its_newest_record() -> None:
    h = _source()
    h.tier("src")  # one segment [0, 40), records of T0 to T0+3h
    h.evict("src")
    h.fork("fork", "src", offset=20, retention_age=3600, now=T0 + 3 * HOUR_MS)
    fork = h.m("fork")
    assert fork.fork_pos == 20
    # The segment's newest record (T0+3h) is young: nothing before the fork point goes, though the
    # fork's inherited records ([0, 20): T0 and T0+1h) are two hours old and more.
    assert retention_target(h.sm, fork, T0 + 3 * HOUR_MS) is None


def test_the_last_fork_going_trims_a_partly_tiered_and_evicted_source_and_its_counters_match_a_reload() -> None:
    h = _source()
    h.append("src", b"4" * 10, ct=OCTET, now=T0 + 4 * HOUR_MS)
    h.tier("src", 30)
    h.evict("src", 20)  # [0, 20) evicted, [20, 30) tiered, [30, 50) local only
    h.fork("fork", "src", offset=40)
    assert h.one(Retain(B, "src", 40)).code.value == "ok"  # kept while the fork reads it
    assert h.one(DeleteStream(B, "fork")).code.value == "deleted"
    table, fresh = h.sm.table, StateMachine(h.kv).table
    assert (table.local_bytes, table.untiered_bytes) == (fresh.local_bytes, fresh.untiered_bytes) == (10, 10)
    assert table.usage == fresh.usage
    sid = h.m("src").sid
    assert [r.data_pos(k) for k, _ in h.kv.scan(r.DATA, r.data_key(sid, 0), r.data_key(sid + 1, 0))] == [40]
    assert list(h.sm.segments(sid, 0, 50)) == []  # the segment below the earliest offset is released
    assert h.text("src", 40) == b"4" * 10
