"""Automatic retention: where a stream's history may start, given its max-age and max-bytes limits.

The leader's sweep proposes `Retain(auto=True)` with the result; the apply never passes the latest
snapshot. Only a stream's own records are looked at (a fork's history below its fork point is its
source's to keep).
"""

from __future__ import annotations

from app.state_machine import records as r
from app.state_machine.machine import StateMachine
from app.state_machine.records import StreamMeta

MAX_SCAN = 100_000  # records looked at per stream and pass; the next pass goes on from there


def retention_target(machine: StateMachine, meta: StreamMeta, now: int) -> int | None:
    """The boundary to retain from, if it is past the stream's earliest offset now."""
    targets = []
    if meta.retention_bytes is not None and meta.tail - meta.earliest > meta.retention_bytes:
        targets.append(_boundary_at_or_after(machine, meta, meta.tail - meta.retention_bytes))
    if meta.retention_age is not None:
        targets.append(_first_newer(machine, meta, now - meta.retention_age * 1000))
    target = max(targets, default=meta.earliest)
    if meta.latest_snapshot is not None:
        target = min(target, meta.latest_snapshot)
    return target if target > meta.earliest else None


def _boundary_at_or_after(machine: StateMachine, meta: StreamMeta, pos: int) -> int:
    start = max(pos, meta.fork_pos, meta.earliest)
    if start < meta.evicted:
        segment = machine.segment_at(meta.sid, start)
        if segment is not None:
            return next((s for s in segment.record_starts() if s >= start), segment.hi)
    for key, _ in machine.kv.scan_heads(r.DATA, r.data_key(meta.sid, start), r.data_key(meta.sid, meta.tail)):
        return r.data_pos(key)
    return meta.tail


def _first_newer(machine: StateMachine, meta: StreamMeta, cutoff: int) -> int:
    """The start of the first record appended at or after `cutoff` (ms); segments count by their newest record."""
    pos = max(meta.earliest, meta.fork_pos)
    for segment in machine.segments(meta.sid, pos, meta.evicted):
        if segment.max_time >= cutoff:
            return max(pos, segment.lo)
        pos = segment.hi
    records = machine.kv.scan_heads(
        r.DATA, r.data_key(meta.sid, pos), r.data_key(meta.sid, meta.tail), r.RECORD_HEADER_SIZE
    )
    for scanned, (key, value) in enumerate(records):
        if r.record_time(value) >= cutoff or scanned >= MAX_SCAN:
            return r.data_pos(key)
    return meta.tail
