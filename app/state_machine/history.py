"""Rules for a stream's history: application attributes, published snapshots, and retention."""

from __future__ import annotations

from app.state_machine import records as r
from app.state_machine.cold_tier import dequeue_object, enqueue_object
from app.state_machine.commands import Code, DeleteSnapshot, Outcome, PublishSnapshot, Retain, SetAttrs
from app.state_machine.expiry import existing, present
from app.state_machine.outcomes import history_outcome
from app.state_machine.reader import is_boundary
from app.state_machine.removal import trim
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
    answer = meta if isinstance(meta, Outcome) else _publish_answer(table, meta, cmd)
    if answer is not None:
        named = not isinstance(meta, Outcome) and cmd.key in snapshot_keys(table, meta.sid)
        if cmd.key is not None and answer.code is not Code.EXISTS and not named:
            enqueue_object(table, cmd.key)  # uploaded before the refusal: nothing else would delete it
        return answer
    assert not isinstance(meta, Outcome)
    snapshot = r.PublishedSnapshot(cmd.content_type, cmd.sha256, cmd.size, now, cmd.inline, cmd.key)
    table.stage(r.STREAM_SNAPSHOTS, r.data_key(meta.sid, cmd.pos), r.encode(snapshot))
    table.index_snapshot(meta.sid, meta.bucket, snapshot, 1)
    if cmd.key is not None:
        dequeue_object(table, cmd.key)  # the same content may have been queued
    if meta.latest_snapshot is None or cmd.pos > meta.latest_snapshot:
        meta.latest_snapshot = cmd.pos
    table.dirty.add(meta.sid)
    return _snapshot_outcome(Code.CREATED, meta, cmd.pos, cmd.sha256)


def publish_refusal(table: StreamTable, cmd: PublishSnapshot, now: int) -> Outcome | None:
    """The refusal `publish_snapshot` would answer, known from the applied state without changing it."""
    meta = present(table, cmd.bucket, cmd.stream, now, cmd.touched)
    answer = meta if isinstance(meta, Outcome) else _publish_answer(table, meta, cmd)
    return None if answer is None or answer.code is Code.EXISTS else answer


def _publish_answer(table: StreamTable, meta: r.StreamMeta, cmd: PublishSnapshot) -> Outcome | None:
    """The answer to a publish other than creating the snapshot; None when it creates one."""
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
    return None


def _snapshot_outcome(code: Code, meta: r.StreamMeta, pos: int, sha256: str) -> Outcome:
    outcome = history_outcome(code, meta)
    outcome.snapshot_pos, outcome.snapshot_sha256 = pos, sha256
    return outcome


def delete_snapshot(table: StreamTable, cmd: DeleteSnapshot, now: int) -> Outcome:
    meta = existing(table, cmd.bucket, cmd.stream, now, cmd.touched)
    if isinstance(meta, Outcome):
        return meta
    found = _deletable(table, meta, cmd.pos)
    if isinstance(found, Outcome):
        return found
    table.unstage(r.STREAM_SNAPSHOTS, r.data_key(meta.sid, cmd.pos))
    if table.index_snapshot(meta.sid, meta.bucket, found, -1):
        assert found.key is not None
        enqueue_object(table, found.key)
    return history_outcome(Code.DELETED, meta)


def delete_refusal(table: StreamTable, cmd: DeleteSnapshot, now: int) -> Outcome | None:
    meta = present(table, cmd.bucket, cmd.stream, now, cmd.touched)
    if isinstance(meta, Outcome):
        return meta
    found = _deletable(table, meta, cmd.pos)
    return found if isinstance(found, Outcome) else None


def _deletable(table: StreamTable, meta: r.StreamMeta, pos: int) -> r.PublishedSnapshot | Outcome:
    found = snapshot_at(table, meta.sid, pos)
    if found is None:
        return history_outcome(Code.SNAPSHOT_NOT_FOUND, meta, "no snapshot at this offset")
    if pos == meta.latest_snapshot:
        return history_outcome(Code.SNAPSHOT_LATEST, meta, "the latest snapshot cannot be deleted")
    return found


def retain(table: StreamTable, cmd: Retain, now: int) -> Outcome:
    meta = existing(table, cmd.bucket, cmd.stream, now, cmd.touched)
    if isinstance(meta, Outcome):
        return meta
    pos = _retained_from(table, meta, cmd)
    if isinstance(pos, Outcome):
        return pos
    if pos == meta.earliest:
        return history_outcome(Code.OK, meta)
    trim(table, meta, pos)
    before = kept(meta)
    meta.earliest = pos
    table.count_usage(meta.bucket, 0, kept(meta) - before)
    table.dirty.add(meta.sid)
    table.changed.add(meta.sid)
    return history_outcome(Code.OK, meta)


def retain_refusal(table: StreamTable, cmd: Retain, now: int) -> Outcome | None:
    meta = present(table, cmd.bucket, cmd.stream, now, cmd.touched)
    if isinstance(meta, Outcome):
        return meta
    pos = _retained_from(table, meta, cmd)
    return pos if isinstance(pos, Outcome) else None


def _retained_from(table: StreamTable, meta: r.StreamMeta, cmd: Retain) -> int | Outcome:
    """Where the stream's history is to start, or why it may not."""
    pos = cmd.pos
    if cmd.auto and meta.latest_snapshot is not None:
        pos = min(pos, meta.latest_snapshot)
    if pos > meta.tail:
        return history_outcome(Code.BEYOND_TAIL, meta, "the retention offset is past the stream's tail")
    if pos < meta.earliest:
        return history_outcome(Code.RETENTION_BACKWARDS, meta, "retention never moves backwards")
    if pos == meta.earliest:
        return pos
    if not is_boundary(table, meta, pos):
        return history_outcome(Code.NOT_BOUNDARY, meta, "the retention offset is not a message boundary")
    if meta.latest_snapshot is not None and pos > meta.latest_snapshot:
        return history_outcome(Code.BEYOND_SNAPSHOT, meta, "retention may not pass the latest snapshot")
    return pos
