"""Rules of the cold tier: recording uploaded segments, evicting their local copy, and the queue of
objects to delete from the object store.

The tiering worker proposes TierSegment and Evict; a retried or superseded proposal finds the
stream moved on and is answered STALE, so applying it twice changes nothing.
"""

from __future__ import annotations

from app.state_machine import records as r
from app.state_machine.commands import Code, Evict, ForgetObjects, Outcome, TierSegment
from app.state_machine.reader import is_boundary, segment_at
from app.state_machine.table import StreamTable


def manifest_of(segment_key: str) -> str:
    """The manifest beside a segment: `{dir}/segments/{range}.parquet` -> `{dir}/manifest.json`."""
    return segment_key.rsplit("/segments/", 1)[0] + "/manifest.json"


def tier_segment(table: StreamTable, cmd: TierSegment, now: int) -> Outcome:
    meta, segment = table.streams.get(cmd.sid), cmd.segment
    # Stale if the stream is gone or tiering moved on (a retried or superseded proposal).
    if meta is None or segment.lo != meta.tiered or not segment.lo < segment.hi <= meta.tail:
        return Outcome(Code.STALE)
    if not segment.starts or not is_boundary(table, meta, segment.hi):
        return Outcome(Code.STALE)
    table.stage(r.SEGMENTS, r.data_key(meta.sid, segment.lo), r.encode(segment))
    # The same key may have been queued for deletion by an earlier stream of the same name.
    for key in (segment.key, manifest_of(segment.key)):
        dequeue_object(table, key)
    meta.tiered = segment.hi
    table.untiered_bytes -= segment.hi - segment.lo
    table.dirty.add(meta.sid)
    return Outcome(Code.OK, sid=meta.sid, next_pos=segment.hi)


def evict(table: StreamTable, cmd: Evict, now: int) -> Outcome:
    meta = table.streams.get(cmd.sid)
    if meta is None or not meta.evicted < cmd.upto <= meta.tiered:
        return Outcome(Code.STALE)
    segment = segment_at(table, meta.sid, cmd.upto - 1)
    if segment is None or segment.hi != cmd.upto:
        return Outcome(Code.STALE)
    table.batch.delete_range(r.DATA, r.data_key(meta.sid, meta.evicted), r.data_key(meta.sid, cmd.upto))
    table.local_bytes -= cmd.upto - meta.evicted
    meta.evicted = cmd.upto
    table.dirty.add(meta.sid)
    return Outcome(Code.OK, sid=meta.sid, next_pos=cmd.upto)


def forget_objects(table: StreamTable, cmd: ForgetObjects, now: int) -> Outcome:
    for key in cmd.keys:
        dequeue_object(table, key)
    return Outcome(Code.OK)


def enqueue_segment(table: StreamTable, segment_key: str) -> None:
    """A deleted stream's segment, and the manifest that listed it."""
    enqueue_object(table, segment_key)
    enqueue_object(table, manifest_of(segment_key))


def enqueue_object(table: StreamTable, key: str) -> None:
    table.batch.put(r.GC_QUEUE, key.encode(), b"")


def dequeue_object(table: StreamTable, key: str) -> None:
    table.batch.delete(r.GC_QUEUE, key.encode())
