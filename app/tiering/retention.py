"""Automatic retention: where a stream's history may start, given its max-age and max-bytes limits,
and when the leader looks again.

The leader's sweep proposes `Retain(auto=True)` with the result; the apply never passes the latest
snapshot. A fork's history below its fork point is its sources' records: their times and sizes count
for the fork's limits as its own do (the sources keep the bytes while forks read them).

A pass looks at the streams with retention that were written since the last pass (a max-bytes
limit is passed only by growing) and at those whose max-age check is due: when their oldest record
kept passes the max-age, at least a second apart, so an idle stream costs no pass until then. A new
term looks at every one once.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable

from app.state_machine import records as r
from app.state_machine.machine import StateMachine
from app.state_machine.records import StreamMeta

MAX_SCAN = 100_000  # records looked at per stream and pass; the next pass goes on from there
MIN_RECHECK_MS = 1_000


class RetentionSchedule:
    def __init__(self) -> None:
        self._all = True
        self._heap: list[tuple[int, int]] = []  # (when, sid)
        self._next: dict[int, int] = {}  # sid -> when its live heap entry is due

    def forget(self) -> None:
        """Leadership was lost: the next term starts over with every stream."""
        self._all = True
        self._heap.clear()
        self._next.clear()

    def due(self, machine: StateMachine, now: int) -> list[int]:
        """The streams to look at now, taken off the schedule."""
        upkeep = machine.upkeep
        written = upkeep.take_retention()
        if self._all:
            self._all = False
            return list(upkeep.retained)
        heap = self._heap
        while heap and heap[0][0] <= now:
            at, sid = heapq.heappop(heap)
            if self._next.get(sid) == at:
                del self._next[sid]
                written.add(sid)
        return sorted(written)

    def checked(self, machine: StateMachine, meta: StreamMeta, now: int) -> None:
        """The stream was looked at: a max-age is looked at again when its oldest record passes it
        (a stream with none is looked at again once written), at least a second from now."""
        if meta.retention_age is None:
            return
        oldest = _oldest_time(machine, meta)
        if oldest is not None:
            self.again(meta.sid, max(now + MIN_RECHECK_MS, oldest + meta.retention_age * 1000))

    def again(self, sid: int, at: int) -> None:
        known = self._next.get(sid)
        if known is None or at < known:
            self._next[sid] = at
            heapq.heappush(self._heap, (at, sid))

    def retry(self, sids: Iterable[int], now: int) -> None:
        """A pass stopped before these: the next one looks at them."""
        for sid in sids:
            self.again(sid, now)


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


def _oldest_time(machine: StateMachine, meta: StreamMeta) -> int | None:
    """When the stream's oldest record kept was appended (its segment's oldest, once evicted)."""
    for sid, lo, hi in machine.ranges(meta, meta.earliest, meta.tail):
        if lo < machine.streams[sid].evicted:
            segment = machine.segment_at(sid, lo)
            return segment.min_time if segment is not None else None
        for _, value in machine.kv.scan_heads(r.DATA, r.data_key(sid, lo), r.data_key(sid, hi), r.RECORD_HEADER_SIZE):
            return r.record_time(value)
    return None


def _boundary_at_or_after(machine: StateMachine, meta: StreamMeta, pos: int) -> int:
    for sid, lo, hi in machine.ranges(meta, max(pos, meta.earliest), meta.tail):
        if lo < machine.streams[sid].evicted:
            segment = machine.segment_at(sid, lo)
            if segment is not None:
                start = next((s for s in segment.record_starts() if s >= lo), segment.hi)
                if start < hi:
                    return start
                continue
        for key, _ in machine.kv.scan_heads(r.DATA, r.data_key(sid, lo), r.data_key(sid, hi)):
            return r.data_pos(key)
    return meta.tail


def _first_newer(machine: StateMachine, meta: StreamMeta, cutoff: int) -> int:
    """The start of the first record appended at or after `cutoff` (ms); segments count by their newest
    record. A fork's records below its fork point are its sources': their times count as well."""
    scanned = 0
    for sid, lo, hi in machine.ranges(meta, meta.earliest, meta.tail):
        pos = lo
        for segment in machine.segments(sid, lo, min(hi, machine.streams[sid].evicted)):
            if segment.max_time >= cutoff:
                return max(pos, segment.lo)
            pos = segment.hi
        if pos >= hi:
            continue
        records = machine.kv.scan_heads(r.DATA, r.data_key(sid, pos), r.data_key(sid, hi), r.RECORD_HEADER_SIZE)
        for key, value in records:
            if r.record_time(value) >= cutoff or scanned >= MAX_SCAN:
                return r.data_pos(key)
            scanned += 1
    return meta.tail
