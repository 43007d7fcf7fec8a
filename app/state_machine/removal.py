"""Removing a stream: soft while forks still read through it, else for good with all it owns."""

from __future__ import annotations

from app.state_machine import records as r
from app.state_machine.cold_tier import release_segment
from app.state_machine.reader import segments
from app.state_machine.snapshots import drop_snapshots
from app.state_machine.table import StreamTable


def remove(table: StreamTable, meta: r.StreamMeta) -> None:
    """Soft-deletes a stream that forks still reference, else deletes it and releases its source."""
    table.changed.add(meta.sid)
    _forget_positions(table, meta)
    if meta.forks > 0:
        meta.deleted = True
        table.dirty.add(meta.sid)
        return
    sid = meta.sid
    table.untiered_bytes -= meta.tail - meta.tiered
    table.local_bytes -= meta.tail - meta.evicted
    for segment in list(segments(table, sid, 0, meta.tail)):
        release_segment(table, sid, segment, manifest=True)
    drop_snapshots(table, sid)
    table.batch.delete_range(r.SEGMENTS, r.sid_key(sid), r.sid_key(sid + 1))
    table.drop(meta)
    table.batch.delete_range(r.DATA, r.data_key(sid, 0), r.data_key(sid + 1, 0))
    table.batch.delete_range(r.PRODUCERS, r.sid_key(sid), r.sid_key(sid + 1))
    if meta.fork_of is not None:
        source = table.streams.get(meta.fork_of)
        if source is not None:
            source.forks -= 1
            table.dirty.add(source.sid)
            if source.forks == 0 and source.deleted:
                remove(table, source)
            elif source.forks == 0:
                trim(table, source, source.earliest)  # what retention kept for the forks alone


def _forget_positions(table: StreamTable, meta: r.StreamMeta) -> None:
    """A stream is removed: the subscriptions covering it are to forget its position (once per entry
    for all the streams it removes: see `subscriptions.forget_positions`), so a stream made again
    under its name is covered from its beginning."""
    for key in table.coverage.covering(meta):
        table.forgotten.setdefault(key, set()).add(meta.name[len(table.coverage.scopes[key].prefix) :])


def trim(table: StreamTable, meta: r.StreamMeta, pos: int) -> None:
    """Deletes own records below `pos`, locally and (through the queue) in the object store.

    A stream with forks keeps its data: a fork reads below its fork point from it. It is trimmed
    when its last fork goes.
    """
    lo, sid = meta.fork_pos, meta.sid
    if meta.forks > 0 or pos <= lo:
        return
    table.batch.delete_range(r.DATA, r.data_key(sid, lo), r.data_key(sid, pos))
    table.local_bytes -= max(0, pos - max(meta.evicted, lo))
    table.untiered_bytes -= max(0, pos - max(meta.tiered, lo))
    for segment in list(segments(table, sid, lo, pos)):
        if segment.hi <= pos:
            table.unstage(r.SEGMENTS, r.data_key(sid, segment.lo))
            # The manifest too: the tiering worker keeps it while own segments remain beside it.
            release_segment(table, sid, segment, manifest=True)
    meta.tiered = max(meta.tiered, pos)
    meta.evicted = max(meta.evicted, pos)
