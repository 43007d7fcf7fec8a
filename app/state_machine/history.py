"""Rules for a stream's history: application attributes, published snapshots, and retention."""

from __future__ import annotations

from app.state_machine import records as r
from app.state_machine.cold_tier import dequeue_object, enqueue_object, release_segment
from app.state_machine.commands import Code, DeleteSnapshot, Outcome, PublishSnapshot, Retain, SetAttrs
from app.state_machine.expiry import existing
from app.state_machine.outcomes import history_outcome
from app.state_machine.reader import is_boundary, segments
from app.state_machine.snapshots import snapshot_at, snapshot_keys
from app.state_machine.table import StreamTable, kept


def set_attrs(table: StreamTable, cmd: SetAttrs, now: int) -> Outcome:
    meta = existing(table, cmd.bucket, cmd.stream, now, cmd.touched)
    if isinstance(meta, Outcome):
        return meta
    meta.attrs = cmd.attrs  # closed streams too; offsets and ETags do not change
    table.dirty.add(meta.sid)
    return history_outcome(Code.OK, meta)


def publish_snapshot(table: StreamTable, cmd: PublishSnapshot, now: int) -> Outcome:
    meta = existing(table, cmd.bucket, cmd.stream, now, cmd.touched)
    if isinstance(meta, Outcome):
        return meta
    if cmd.pos > meta.tail:
        return history_outcome(Code.BEYOND_TAIL, meta, "the snapshot offset is past the stream's tail")
    if cmd.pos < meta.earliest:
        return history_outcome(Code.TRIMMED, meta, "the snapshot offset is before the retained history")
    if not is_boundary(table, meta, cmd.pos):
        return history_outcome(Code.NOT_BOUNDARY, meta, "the snapshot offset is not a message boundary")
    found = snapshot_at(table, meta.sid, cmd.pos)
    if found is not None:
        if found.sha256 != cmd.sha256:
            return history_outcome(Code.SNAPSHOT_CONFLICT, meta, "a different snapshot exists at this offset")
        return _snapshot_outcome(Code.EXISTS, meta, cmd.pos, found.sha256)
    if cmd.match is not None:
        latest = snapshot_at(table, meta.sid, meta.latest_snapshot) if meta.latest_snapshot is not None else None
        if latest is None or latest.sha256 != cmd.match:
            return history_outcome(Code.SNAPSHOT_MISMATCH, meta, "the latest snapshot does not match")
    snapshot = r.PublishedSnapshot(cmd.content_type, cmd.sha256, cmd.size, now, cmd.inline, cmd.key)
    table.stage(r.STREAM_SNAPSHOTS, r.data_key(meta.sid, cmd.pos), r.encode(snapshot))
    table.count_snapshot(meta.bucket, cmd.size)
    if cmd.key is not None:
        dequeue_object(table, cmd.key)  # the same content may have been queued
    if meta.latest_snapshot is None or cmd.pos > meta.latest_snapshot:
        meta.latest_snapshot = cmd.pos
    table.dirty.add(meta.sid)
    return _snapshot_outcome(Code.CREATED, meta, cmd.pos, cmd.sha256)


def _snapshot_outcome(code: Code, meta: r.StreamMeta, pos: int, sha256: str) -> Outcome:
    outcome = history_outcome(code, meta)
    outcome.snapshot_pos, outcome.snapshot_sha256 = pos, sha256
    return outcome


def delete_snapshot(table: StreamTable, cmd: DeleteSnapshot, now: int) -> Outcome:
    meta = existing(table, cmd.bucket, cmd.stream, now, cmd.touched)
    if isinstance(meta, Outcome):
        return meta
    found = snapshot_at(table, meta.sid, cmd.pos)
    if found is None:
        return history_outcome(Code.SNAPSHOT_NOT_FOUND, meta, "no snapshot at this offset")
    if cmd.pos == meta.latest_snapshot:
        return history_outcome(Code.SNAPSHOT_LATEST, meta, "the latest snapshot cannot be deleted")
    table.unstage(r.STREAM_SNAPSHOTS, r.data_key(meta.sid, cmd.pos))
    table.count_snapshot(meta.bucket, -found.size)
    if found.key is not None and found.key not in snapshot_keys(table, meta.sid, but=cmd.pos):
        enqueue_object(table, found.key)
    return history_outcome(Code.DELETED, meta)


def retain(table: StreamTable, cmd: Retain, now: int) -> Outcome:
    meta = existing(table, cmd.bucket, cmd.stream, now, cmd.touched)
    if isinstance(meta, Outcome):
        return meta
    pos = cmd.pos
    if cmd.auto and meta.latest_snapshot is not None:
        pos = min(pos, meta.latest_snapshot)
    if pos > meta.tail:
        return history_outcome(Code.BEYOND_TAIL, meta, "the retention offset is past the stream's tail")
    if pos < meta.earliest:
        return history_outcome(Code.RETENTION_BACKWARDS, meta, "retention never moves backwards")
    if pos == meta.earliest:
        return history_outcome(Code.OK, meta)
    if not is_boundary(table, meta, pos):
        return history_outcome(Code.NOT_BOUNDARY, meta, "the retention offset is not a message boundary")
    if meta.latest_snapshot is not None and pos > meta.latest_snapshot:
        return history_outcome(Code.BEYOND_SNAPSHOT, meta, "retention may not pass the latest snapshot")
    _trim(table, meta, pos)
    before = kept(meta)
    meta.earliest = pos
    table.count_usage(meta.bucket, 0, kept(meta) - before)
    table.dirty.add(meta.sid)
    table.changed.add(meta.sid)
    return history_outcome(Code.OK, meta)


def _trim(table: StreamTable, meta: r.StreamMeta, pos: int) -> None:
    """Deletes own records below `pos`, locally and (through the queue) in the object store.

    A stream with forks keeps its data: a fork reads below its fork point from it.
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
