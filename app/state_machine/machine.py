"""The replicated state machine: deterministic apply of committed commands.

Every replica applies the same entries in the same order and ends in the
same state. Apply uses only the entry's stamped `now`, and writes each batch
of entries together with the new applied index in one KV write batch, so a
crash never leaves an entry half-applied. Reads are served by `StreamReader`
over the same store.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from app.domain.media import media_type
from app.raft.messages import MEMBERSHIP, Entry, Membership, decode_membership
from app.state_machine import records as r
from app.state_machine.commands import (
    Append,
    AppendBatch,
    Code,
    CollectExpired,
    CreateBucket,
    CreateStream,
    DeleteBucket,
    DeleteSnapshot,
    DeleteStream,
    Evict,
    ForgetObjects,
    Outcome,
    Producer,
    PublishSnapshot,
    Retain,
    SetAttrs,
    TierSegment,
    Touch,
    decode_envelope,
)
from app.state_machine.history import HistoryRules
from app.state_machine.producers import Verdict, expected_seq, judge
from app.state_machine.reader import StreamReader
from app.storage.kv import KV, Batch


def manifest_of(segment_key: str) -> str:
    """The manifest beside a segment: `{dir}/segments/{range}.parquet` -> `{dir}/manifest.json`."""
    return segment_key.rsplit("/segments/", 1)[0] + "/manifest.json"


# Buckets that always exist: the legacy and compat route families live here.
# Their names contain a dot, which user bucket names cannot.
LEGACY_BUCKET = "legacy.streams"
COMPAT_BUCKET = "compat.v1"
BUILTIN_BUCKETS = (LEGACY_BUCKET, COMPAT_BUCKET)


class StateMachine(HistoryRules):
    def __init__(self, kv: KV, on_change: Callable[[set[int]], None] | None = None) -> None:
        super().__init__(kv)
        self._load()
        self.on_change = on_change
        self._handlers: dict[type, Callable[[Any, int], Outcome]] = {
            Append: self._append,
            CreateStream: self._create_stream,
            DeleteStream: self._delete_stream,
            Touch: self._touch,
            CreateBucket: self._create_bucket,
            DeleteBucket: self._delete_bucket,
            CollectExpired: self._collect,
            TierSegment: self._tier_segment,
            Evict: self._evict,
            ForgetObjects: self._forget_objects,
            AppendBatch: self._append_batch,
            SetAttrs: self._set_attrs,
            Retain: self._retain,
            PublishSnapshot: self._publish_snapshot,
            DeleteSnapshot: self._delete_snapshot,
        }
        self._batch = Batch()
        self._dirty: set[int] = set()
        self._changed: set[int] = set()

    def _load(self) -> None:
        kv = self.kv
        self.applied_index, self.applied_term = r.decode_applied(kv.get(r.SM_META, r.APPLIED_KEY))
        raw = kv.get(r.SM_META, r.MEMBERSHIP_KEY)
        self.membership: Membership | None = decode_membership(raw) if raw else None
        raw = kv.get(r.SM_META, r.NEXT_SID_KEY)
        self.next_sid = r.U64.unpack(raw)[0] if raw else 1
        self.buckets: dict[str, int] = {b: 0 for b in BUILTIN_BUCKETS}
        # bucket -> (max-age, max-bytes) given to its streams that set no retention of their own
        self.bucket_retention: dict[str, tuple[int | None, int | None]] = {}
        for key, value in kv.scan(r.BUCKETS, b""):
            self.buckets[key.decode()] = r.U64.unpack_from(value)[0]
            if len(value) > r.U64.size:
                self.bucket_retention[key.decode()] = r.decode_retention(value[r.U64.size :])
        # Bytes of own records not yet in the object store, and still on local disk.
        self.untiered_bytes = self.local_bytes = 0
        for _, value in kv.scan(r.STREAMS, b""):
            meta = r.decode_meta(value)
            if meta.tiered < meta.fork_pos:  # written before the cold tier existed
                meta.tiered = meta.evicted = meta.fork_pos
            self.streams[meta.sid] = meta
            self.names[(meta.bucket, meta.name)] = meta.sid
            self.untiered_bytes += meta.tail - meta.tiered
            self.local_bytes += meta.tail - meta.evicted

    def reload(self, kv: KV) -> None:
        """Starts over from another store: a snapshot installed from the leader."""
        before = set(self.streams)
        StreamReader.__init__(self, kv)
        self._load()
        if self.on_change is not None:
            self.on_change(before | set(self.streams))  # live readers re-check what they follow

    # Apply

    def apply(self, entries: list[Entry]) -> list[Outcome | None]:
        results: list[Outcome | None] = []
        for entry in entries:
            if entry.kind == MEMBERSHIP:
                self.membership = decode_membership(entry.data)
                self._batch.put(r.SM_META, r.MEMBERSHIP_KEY, entry.data)
                results.append(None)
                continue
            if not entry.data:
                results.append(None)
                continue
            env = decode_envelope(entry.data)
            results.append(self._dispatch(env.command, env.now))
        self.applied_index, self.applied_term = entries[-1].index, entries[-1].term
        for sid in self._dirty:
            meta = self.streams.get(sid)
            if meta is not None:
                self._batch.put(r.STREAMS, r.sid_key(sid), r.encode(meta))
        self._batch.put(r.SM_META, r.APPLIED_KEY, r.encode_applied(self.applied_index, self.applied_term))
        self._batch.put(r.SM_META, r.NEXT_SID_KEY, r.U64.pack(self.next_sid))
        self.kv.write(self._batch)
        self._batch, self._dirty = Batch(), set()
        self.staged.clear()
        if self._changed and self.on_change is not None:
            changed, self._changed = self._changed, set()
            self.on_change(changed)
        return results

    def make_durable(self) -> None:
        """Syncs the store's log, so every apply written before this call survives a crash.

        It may run on another thread than apply, so it writes a marker, never the applied index.
        """
        batch = Batch()
        batch.put(r.SM_META, r.SYNCED_KEY, b"")
        self.kv.write(batch, sync=True)

    def _dispatch(self, cmd: object, now: int) -> Outcome:
        return self._handlers[type(cmd)](cmd, now)

    # Buckets

    def _create_bucket(self, cmd: CreateBucket, now: int) -> Outcome:
        if cmd.bucket in self.buckets:
            return Outcome(Code.EXISTS)
        self.buckets[cmd.bucket] = now
        value = r.U64.pack(now)
        if cmd.retention_age is not None or cmd.retention_bytes is not None:
            self.bucket_retention[cmd.bucket] = (cmd.retention_age, cmd.retention_bytes)
            value += r.encode_retention(cmd.retention_age, cmd.retention_bytes)
        self._batch.put(r.BUCKETS, cmd.bucket.encode(), value)
        return Outcome(Code.CREATED)

    def _delete_bucket(self, cmd: DeleteBucket, now: int) -> Outcome:
        if cmd.bucket not in self.buckets or cmd.bucket in BUILTIN_BUCKETS:
            return Outcome(Code.BUCKET_NOT_FOUND)
        for bucket, name in [key for key in self.names if key[0] == cmd.bucket]:
            self._live(bucket, name, now)
        if any(b == cmd.bucket for b, _ in self.names):
            return Outcome(Code.BUCKET_NOT_EMPTY, "the bucket still holds streams")
        del self.buckets[cmd.bucket]
        self.bucket_retention.pop(cmd.bucket, None)
        self._batch.delete(r.BUCKETS, cmd.bucket.encode())
        return Outcome(Code.DELETED)

    # Streams

    def _live(self, bucket: str, name: str, now: int, touched: int = 0) -> r.StreamMeta | None:
        """The stream at this name after collecting it if it has expired (may be soft-deleted)."""
        sid = self.names.get((bucket, name))
        if sid is None:
            return None
        meta = self.streams[sid]
        if not meta.deleted and meta.expired(now, touched):
            self._remove(meta)
            return self.streams.get(sid)
        return meta

    def _create_stream(self, cmd: CreateStream, now: int) -> Outcome:
        if cmd.bucket not in self.buckets:
            return Outcome(Code.BUCKET_NOT_FOUND)
        existing = self._live(cmd.bucket, cmd.stream, now, cmd.touched)
        source = None
        fork_pos = fork_offset = 0
        prefix = b""
        if cmd.fork_stream is not None:
            source = self._live(cmd.bucket, cmd.fork_stream, now)
            if source is None:
                return Outcome(Code.NOT_FOUND, "fork source not found")
            if source.deleted:
                return Outcome(Code.SOURCE_DELETED, "fork source is deleted")
            if cmd.content_type_given and media_type(source.content_type) != media_type(cmd.content_type):
                return Outcome(Code.CONTENT_TYPE_MISMATCH, "fork content type differs from its source")
            fork_offset = source.tail if cmd.fork_offset is None else cmd.fork_offset
            if fork_offset < source.earliest:
                return Outcome(Code.BAD_FORK_OFFSET, "fork offset is before the source's retained history")
            if fork_offset > source.tail or not self.is_boundary(source, fork_offset):
                return Outcome(Code.BAD_FORK_OFFSET, "fork offset is not a message boundary of the source")
            fork_pos = fork_offset
            if cmd.fork_sub:
                prefix_or_none = self.record_prefix(source, fork_offset, cmd.fork_sub, cmd.evicted_record)
                if prefix_or_none is None:
                    return Outcome(Code.BAD_SUB_OFFSET, "fork sub-offset exceeds the message at the fork offset")
                prefix = prefix_or_none
        content_type = source.content_type if source and not cmd.content_type_given else cmd.content_type
        retention = (cmd.retention_age, cmd.retention_bytes)
        if retention == (None, None):
            retention = self.bucket_retention.get(cmd.bucket, retention)
        ttl, expires_at = cmd.ttl, cmd.expires_at
        if source is not None and ttl is None and expires_at is None:
            ttl, expires_at = source.ttl, source.expires_at
        if existing is not None:
            if existing.deleted:
                return Outcome(Code.CONFIG_MISMATCH, "stream is deleted but still referenced by forks")
            same = (
                media_type(existing.content_type) == media_type(content_type)
                and existing.ttl == ttl
                and existing.expires_at == expires_at
                and existing.closed == cmd.closed
                and existing.attrs == cmd.attrs
                and (existing.retention_age, existing.retention_bytes) == retention
                and existing.fork_of == (source.sid if source else None)
                and (source is None or (existing.fork_offset, existing.fork_sub) == (fork_offset, cmd.fork_sub))
            )
            if not same:
                return Outcome(Code.CONFIG_MISMATCH, "stream exists with a different configuration")
            return self._stream_outcome(Code.EXISTS, existing)
        sid = self.next_sid
        self.next_sid += 1
        meta = r.StreamMeta(
            sid=sid,
            bucket=cmd.bucket,
            name=cmd.stream,
            content_type=content_type,
            json=cmd.json if source is None else source.json,
            created_at=now,
            touched_at=now,
            ttl=ttl,
            expires_at=expires_at,
            tail=fork_pos,
            fork_of=source.sid if source else None,
            fork_pos=fork_pos,
            fork_offset=fork_offset,
            fork_sub=cmd.fork_sub,
            tiered=fork_pos,
            evicted=fork_pos,
            earliest=source.earliest if source else 0,  # what the source no longer has, the fork lacks too
            attrs=cmd.attrs,
            retention_age=retention[0],
            retention_bytes=retention[1],
        )
        self.streams[sid] = meta
        self.names[(cmd.bucket, cmd.stream)] = sid
        self._batch.put(r.NAMES, r.name_key(cmd.bucket, cmd.stream), r.sid_key(sid))
        if source is not None:
            source.forks += 1
            self._dirty.add(source.sid)
        for body in (prefix, cmd.body):
            if body:
                self._write_record(meta, body, now)
        meta.closed = cmd.closed
        self._dirty.add(sid)
        self._changed.add(sid)
        return self._stream_outcome(Code.CREATED, meta)

    def _append(self, cmd: Append, now: int) -> Outcome:
        if cmd.bucket not in self.buckets:
            return Outcome(Code.BUCKET_NOT_FOUND)
        meta = self._live(cmd.bucket, cmd.stream, now, cmd.touched)
        if meta is None:
            return Outcome(Code.NOT_FOUND)
        if meta.deleted:
            return Outcome(Code.GONE)
        producer_state = None
        if cmd.producer is not None:
            pkey = r.producer_key(meta.sid, cmd.producer.id)
            raw = self.staged.get((r.PRODUCERS, pkey)) or self.kv.get(r.PRODUCERS, pkey)
            producer_state = r.decode_producer(raw) if raw else None
            verdict = judge(producer_state, cmd.producer)
            if verdict is not Verdict.ACCEPT:
                return self._producer_rejection(verdict, meta, producer_state, cmd.producer)
        if meta.closed:
            if cmd.body:
                return self._stream_outcome(Code.STREAM_CLOSED, meta, "stream is closed")
            # Closing a closed stream is idempotent: it only renews the TTL and takes the producer's seq.
            meta.touched_at = now
            self._dirty.add(meta.sid)
            return self._record_producer(cmd.producer, meta, self._stream_outcome(Code.APPENDED, meta))
        if cmd.body:
            ct = cmd.content_type
            if ct is not None and ct != meta.content_type and media_type(ct) != media_type(meta.content_type):
                return self._stream_outcome(Code.CONTENT_TYPE_MISMATCH, meta, "content type does not match the stream")
            if cmd.stream_seq is not None:
                if meta.stream_seq is not None and cmd.stream_seq <= meta.stream_seq:
                    return self._stream_outcome(Code.SEQ_CONFLICT, meta, "Stream-Seq must increase")
                meta.stream_seq = cmd.stream_seq
            producer = None if cmd.producer is None else (cmd.producer.id, cmd.producer.epoch, cmd.producer.seq)
            self._write_record(meta, cmd.body, now, producer)
        if cmd.close:
            meta.closed = True
        meta.touched_at = now
        self._dirty.add(meta.sid)
        self._changed.add(meta.sid)
        outcome = self._record_producer(cmd.producer, meta, self._stream_outcome(Code.APPENDED, meta))
        outcome.fresh_producer = cmd.producer is not None and bool(cmd.body)
        return outcome

    def _append_batch(self, cmd: AppendBatch, now: int) -> Outcome:
        outcomes = [
            self._append(Append(cmd.bucket, cmd.stream, cmd.content_type, body, touched=cmd.touched), now)
            for body in cmd.bodies
        ]
        last = outcomes[-1] if outcomes else Outcome(Code.OK)
        return Outcome(Code.OK, sid=last.sid, next_pos=last.next_pos, closed=last.closed, batch=outcomes)

    def _record_producer(self, p: Producer | None, meta: r.StreamMeta, outcome: Outcome) -> Outcome:
        if p is not None:
            self._stage(
                r.PRODUCERS, r.producer_key(meta.sid, p.id), r.encode(r.ProducerState(p.epoch, p.seq, meta.tail))
            )
            outcome.producer_epoch, outcome.producer_seq = p.epoch, p.seq
        return outcome

    def _stage(self, cf: str, key: bytes, value: bytes) -> None:
        """Writes into the batch and keeps it readable by later entries of the same batch."""
        self._batch.put(cf, key, value)
        self.staged[(cf, key)] = value

    def _producer_rejection(
        self, verdict: Verdict, meta: r.StreamMeta, state: r.ProducerState | None, p: Producer
    ) -> Outcome:
        if verdict is Verdict.DUPLICATE:
            assert state is not None
            out = self._stream_outcome(Code.DUPLICATE, meta)
            out.next_pos = state.next_pos
            out.producer_epoch, out.producer_seq = state.epoch, state.seq
            return out
        if verdict is Verdict.STALE_EPOCH:
            assert state is not None
            out = self._stream_outcome(Code.STALE_EPOCH, meta, "producer epoch is stale")
            out.producer_epoch = state.epoch
            return out
        if verdict is Verdict.BAD_EPOCH_SEQ:
            return self._stream_outcome(Code.BAD_EPOCH_SEQ, meta, "a new producer epoch must start at seq 0")
        out = self._stream_outcome(Code.SEQ_GAP, meta, "producer sequence gap")
        out.expected_seq, out.received_seq = expected_seq(state, p), p.seq
        return out

    def _delete_stream(self, cmd: DeleteStream, now: int) -> Outcome:
        if cmd.bucket not in self.buckets:
            return Outcome(Code.BUCKET_NOT_FOUND)
        meta = self._live(cmd.bucket, cmd.stream, now, cmd.touched)
        if meta is None:
            return Outcome(Code.NOT_FOUND)
        if meta.deleted:
            return Outcome(Code.GONE)
        self._remove(meta)
        return Outcome(Code.DELETED, sid=meta.sid)

    def _touch(self, cmd: Touch, now: int) -> Outcome:
        meta = self._live(cmd.bucket, cmd.stream, now)
        if meta is None or meta.deleted:
            return Outcome(Code.NOT_FOUND)
        meta.touched_at = max(meta.touched_at, now)
        self._dirty.add(meta.sid)
        return Outcome(Code.OK)

    def _collect(self, cmd: CollectExpired, now: int) -> Outcome:
        for sid in cmd.sids:
            meta = self.streams.get(sid)
            if meta is not None:
                self._live(meta.bucket, meta.name, now)
        return Outcome(Code.OK)

    def _remove(self, meta: r.StreamMeta) -> None:
        """Soft-deletes a stream that forks still reference, else deletes it and releases its source."""
        self._changed.add(meta.sid)
        if meta.forks > 0:
            meta.deleted = True
            self._dirty.add(meta.sid)
            return
        sid = meta.sid
        self.untiered_bytes -= meta.tail - meta.tiered
        self.local_bytes -= meta.tail - meta.evicted
        for segment in self.segments(sid, 0, meta.tail):
            self._enqueue_deletion(segment.key)
        self._drop_snapshots(sid)
        self._batch.delete_range(r.SEGMENTS, r.sid_key(sid), r.sid_key(sid + 1))
        del self.streams[sid]
        del self.names[(meta.bucket, meta.name)]
        self._dirty.discard(sid)
        self._batch.delete(r.NAMES, r.name_key(meta.bucket, meta.name))
        self._batch.delete(r.STREAMS, r.sid_key(sid))
        self._batch.delete_range(r.DATA, r.data_key(sid, 0), r.data_key(sid + 1, 0))
        self._batch.delete_range(r.PRODUCERS, r.sid_key(sid), r.sid_key(sid + 1))
        if meta.fork_of is not None:
            source = self.streams.get(meta.fork_of)
            if source is not None:
                source.forks -= 1
                self._dirty.add(source.sid)
                if source.forks == 0 and source.deleted:
                    self._remove(source)

    def _write_record(
        self, meta: r.StreamMeta, body: bytes, now: int, producer: tuple[str, int, int] | None = None
    ) -> None:
        self._stage(r.DATA, r.data_key(meta.sid, meta.tail), r.encode_record(now, body, producer))
        meta.tail += len(body)
        self.untiered_bytes += len(body)
        self.local_bytes += len(body)

    # Cold tier

    def _tier_segment(self, cmd: TierSegment, now: int) -> Outcome:
        meta, segment = self.streams.get(cmd.sid), cmd.segment
        # Stale if the stream is gone or tiering moved on (a retried or superseded proposal).
        if meta is None or segment.lo != meta.tiered or not segment.lo < segment.hi <= meta.tail:
            return Outcome(Code.STALE)
        if not segment.starts or not self.is_boundary(meta, segment.hi):
            return Outcome(Code.STALE)
        self._stage(r.SEGMENTS, r.data_key(meta.sid, segment.lo), r.encode(segment))
        # The same key may have been queued for deletion by an earlier stream of the same name.
        for key in (segment.key, manifest_of(segment.key)):
            self._batch.delete(r.GC_QUEUE, key.encode())
        meta.tiered = segment.hi
        self.untiered_bytes -= segment.hi - segment.lo
        self._dirty.add(meta.sid)
        return Outcome(Code.OK, sid=meta.sid, next_pos=segment.hi)

    def _evict(self, cmd: Evict, now: int) -> Outcome:
        meta = self.streams.get(cmd.sid)
        if meta is None or not meta.evicted < cmd.upto <= meta.tiered:
            return Outcome(Code.STALE)
        segment = self.segment_at(meta.sid, cmd.upto - 1)
        if segment is None or segment.hi != cmd.upto:
            return Outcome(Code.STALE)
        self._batch.delete_range(r.DATA, r.data_key(meta.sid, meta.evicted), r.data_key(meta.sid, cmd.upto))
        self.local_bytes -= cmd.upto - meta.evicted
        meta.evicted = cmd.upto
        self._dirty.add(meta.sid)
        return Outcome(Code.OK, sid=meta.sid, next_pos=cmd.upto)

    def _forget_objects(self, cmd: ForgetObjects, now: int) -> Outcome:
        for key in cmd.keys:
            self._batch.delete(r.GC_QUEUE, key.encode())
        return Outcome(Code.OK)

    def _enqueue_deletion(self, segment_key: str) -> None:
        """A deleted stream's segment, and the manifest that listed it."""
        self._enqueue_object(segment_key)
        self._enqueue_object(manifest_of(segment_key))

    def _enqueue_object(self, key: str) -> None:
        self._batch.put(r.GC_QUEUE, key.encode(), b"")

    def _stream_outcome(self, code: Code, meta: r.StreamMeta, message: str = "") -> Outcome:
        return Outcome(code, message, sid=meta.sid, next_pos=meta.tail, closed=meta.closed)
