"""Rules of a stream's life: create (optionally as a fork), append, close, and delete."""

from __future__ import annotations

from app.domain.media import media_type
from app.state_machine import records as r
from app.state_machine.commands import Append, AppendBatch, Code, CreateStream, DeleteStream, Outcome
from app.state_machine.expiry import existing, live, present
from app.state_machine.forks import ForkPoint, fork_point
from app.state_machine.outcomes import stream_outcome
from app.state_machine.producers import refusal, remember
from app.state_machine.removal import remove
from app.state_machine.table import StreamTable
from app.storage.kv import Buffer


def create_stream(table: StreamTable, cmd: CreateStream, now: int) -> Outcome:
    if cmd.bucket not in table.buckets:
        return Outcome(Code.BUCKET_NOT_FOUND)
    current = live(table, cmd.bucket, cmd.stream, now, cmd.touched)
    fork = None
    if cmd.fork_stream is not None:
        found = fork_point(table, cmd, now)
        if isinstance(found, Outcome):
            return found
        fork = found
    meta = _wanted(table, cmd, fork, now)
    if current is not None:
        if current.deleted:
            return Outcome(Code.CONFIG_MISMATCH, "stream is deleted but still referenced by forks")
        if not _same_config(current, meta):
            return Outcome(Code.CONFIG_MISMATCH, "stream exists with a different configuration")
        return stream_outcome(Code.EXISTS, current)
    meta.sid = table.new_sid()
    table.insert(meta)
    if fork is not None:
        fork.source.forks += 1
        table.dirty.add(fork.source.sid)
    for body in (fork.prefix if fork else b"", cmd.body):
        if body:
            write_record(table, meta, body, now)
    table.dirty.add(meta.sid)
    table.changed.add(meta.sid)
    return stream_outcome(Code.CREATED, meta)


def _wanted(table: StreamTable, cmd: CreateStream, fork: ForkPoint | None, now: int) -> r.StreamMeta:
    """The stream `cmd` would create, before it has a sid or records.

    A fork takes its source's content type unless one is given, its TTL and expiry unless either is
    given, and lacks what the source no longer has. A stream without retention of its own gets its
    bucket's.
    """
    source = fork.source if fork else None
    offset = fork.offset if fork else 0
    retention = (cmd.retention_age, cmd.retention_bytes)
    if retention == (None, None):
        retention = table.bucket_retention.get(cmd.bucket, retention)
    ttl, expires_at = cmd.ttl, cmd.expires_at
    if source is not None and ttl is None and expires_at is None:
        ttl, expires_at = source.ttl, source.expires_at
    return r.StreamMeta(
        sid=0,
        bucket=cmd.bucket,
        name=cmd.stream,
        content_type=source.content_type if source and not cmd.content_type_given else cmd.content_type,
        json=cmd.json if source is None else source.json,
        created_at=now,
        touched_at=now,
        ttl=ttl,
        expires_at=expires_at,
        closed=cmd.closed,
        tail=offset,
        fork_of=source.sid if source else None,
        fork_pos=offset,
        fork_offset=offset,
        fork_sub=cmd.fork_sub,
        tiered=offset,
        evicted=offset,
        earliest=source.earliest if source else 0,
        attrs=cmd.attrs,
        retention_age=retention[0],
        retention_bytes=retention[1],
    )


def _same_config(existing: r.StreamMeta, wanted: r.StreamMeta) -> bool:
    """Whether a create asking for `wanted` repeats the one that made `existing` (so it is idempotent)."""
    return (
        media_type(existing.content_type) == media_type(wanted.content_type)
        and existing.ttl == wanted.ttl
        and existing.expires_at == wanted.expires_at
        and existing.closed == wanted.closed
        and existing.attrs == wanted.attrs
        and (existing.retention_age, existing.retention_bytes) == (wanted.retention_age, wanted.retention_bytes)
        and existing.fork_of == wanted.fork_of
        and (
            wanted.fork_of is None or (existing.fork_offset, existing.fork_sub) == (wanted.fork_offset, wanted.fork_sub)
        )
    )


def append(table: StreamTable, cmd: Append, now: int) -> Outcome:
    if cmd.bucket not in table.buckets:
        return Outcome(Code.BUCKET_NOT_FOUND)
    meta = existing(table, cmd.bucket, cmd.stream, now, cmd.touched)
    if isinstance(meta, Outcome):
        return meta
    if cmd.producer is not None:
        refused = refusal(table, meta, cmd.producer)
        if refused is not None:
            return refused
    if meta.closed:
        if cmd.body:
            return stream_outcome(Code.STREAM_CLOSED, meta, "stream is closed")
        # Closing a closed stream is idempotent: it only renews the TTL and takes the producer's seq.
        meta.touched_at = max(meta.touched_at, now)  # a leader whose clock is behind must not shorten it
        table.dirty.add(meta.sid)
        return remember(table, cmd.producer, meta, stream_outcome(Code.APPENDED, meta))
    if cmd.body:
        ct = cmd.content_type
        if ct is not None and ct != meta.content_type and media_type(ct) != media_type(meta.content_type):
            return stream_outcome(Code.CONTENT_TYPE_MISMATCH, meta, "content type does not match the stream")
        if cmd.stream_seq is not None:
            if meta.stream_seq is not None and cmd.stream_seq <= meta.stream_seq:
                return stream_outcome(Code.SEQ_CONFLICT, meta, "Stream-Seq must increase")
            meta.stream_seq = cmd.stream_seq
        producer = None if cmd.producer is None else (cmd.producer.id, cmd.producer.epoch, cmd.producer.seq)
        write_record(table, meta, cmd.body, now, producer)
    if cmd.close:
        meta.closed = True
    meta.touched_at = max(meta.touched_at, now)
    table.dirty.add(meta.sid)
    table.changed.add(meta.sid)
    outcome = remember(table, cmd.producer, meta, stream_outcome(Code.APPENDED, meta))
    outcome.fresh_producer = cmd.producer is not None and bool(cmd.body)
    return outcome


def append_refusal(table: StreamTable, cmd: Append, now: int, duplicates: bool = False) -> Outcome | None:
    """The refusal `append` would answer `cmd` with, known from the applied state without changing
    it; None when it may be accepted. A producer's duplicate is None too (the apply answers it),
    unless `duplicates` asks for its outcome."""
    if cmd.bucket not in table.buckets:
        return Outcome(Code.BUCKET_NOT_FOUND)
    meta = present(table, cmd.bucket, cmd.stream, now, cmd.touched)
    if isinstance(meta, Outcome):
        return meta
    if cmd.producer is not None:
        refused = refusal(table, meta, cmd.producer)
        if refused is not None:
            return None if refused.code is Code.DUPLICATE and not duplicates else refused
    if meta.closed:
        return stream_outcome(Code.STREAM_CLOSED, meta, "stream is closed") if cmd.body else None
    if cmd.body:
        ct = cmd.content_type
        if ct is not None and ct != meta.content_type and media_type(ct) != media_type(meta.content_type):
            return stream_outcome(Code.CONTENT_TYPE_MISMATCH, meta, "content type does not match the stream")
        if cmd.stream_seq is not None and meta.stream_seq is not None and cmd.stream_seq <= meta.stream_seq:
            return stream_outcome(Code.SEQ_CONFLICT, meta, "Stream-Seq must increase")
    return None


def delete_refusal(table: StreamTable, cmd: DeleteStream, now: int) -> Outcome | None:
    if cmd.bucket not in table.buckets:
        return Outcome(Code.BUCKET_NOT_FOUND)
    found = present(table, cmd.bucket, cmd.stream, now, cmd.touched)
    return found if isinstance(found, Outcome) else None


def create_refusal(table: StreamTable, cmd: CreateStream, now: int) -> Outcome | None:
    """The refusals of `create_stream` known from the applied state: a missing or deleted fork source,
    and an existing stream of another configuration. The rest is left to the apply."""
    if cmd.bucket not in table.buckets:
        return Outcome(Code.BUCKET_NOT_FOUND)
    if cmd.fork_stream is not None:
        source = present(table, cmd.bucket, cmd.fork_stream, now, cmd.source_touched)
        if isinstance(source, Outcome):
            if source.code is Code.GONE:
                return Outcome(Code.SOURCE_DELETED, "fork source is deleted")
            return Outcome(Code.NOT_FOUND, "fork source not found")
        return None
    sid = table.names.get((cmd.bucket, cmd.stream))
    current = table.streams[sid] if sid is not None else None
    if current is None or current.expired(now, cmd.touched):
        return None
    if current.deleted:
        return Outcome(Code.CONFIG_MISMATCH, "stream is deleted but still referenced by forks")
    if not _same_config(current, _wanted(table, cmd, None, now)):
        return Outcome(Code.CONFIG_MISMATCH, "stream exists with a different configuration")
    return None


def append_batch(table: StreamTable, cmd: AppendBatch, now: int) -> Outcome:
    outcomes = [
        append(table, Append(cmd.bucket, cmd.stream, cmd.content_type, memoryview(body), touched=cmd.touched), now)
        for body in cmd.bodies
    ]
    last = outcomes[-1] if outcomes else Outcome(Code.OK)
    return Outcome(Code.OK, sid=last.sid, next_pos=last.next_pos, closed=last.closed, batch=outcomes)


def delete_stream(table: StreamTable, cmd: DeleteStream, now: int) -> Outcome:
    if cmd.bucket not in table.buckets:
        return Outcome(Code.BUCKET_NOT_FOUND)
    meta = existing(table, cmd.bucket, cmd.stream, now, cmd.touched)
    if isinstance(meta, Outcome):
        return meta
    remove(table, meta)
    return Outcome(Code.DELETED, sid=meta.sid)


def write_record(
    table: StreamTable, meta: r.StreamMeta, body: Buffer, now: int, producer: tuple[str, int, int] | None = None
) -> None:
    table.stage(r.DATA, r.data_key(meta.sid, meta.tail), r.encode_record(now, body, producer))
    table.grown.append(meta.sid)
    table.tail.stage(meta.sid, meta.tail, body)
    meta.tail += len(body)
    table.count_usage(meta.bucket, 0, len(body))
    table.untiered_bytes += len(body)
    table.local_bytes += len(body)
