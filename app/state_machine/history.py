"""Rules for a stream's history: published snapshots, retention, and application attributes.

A mixin of StateMachine: it shares the apply batch and the stream table, and keeps these rules
out of the core append/create/delete code.
"""

from __future__ import annotations

from app.state_machine import records as r
from app.state_machine.commands import Code, DeleteSnapshot, Outcome, PublishSnapshot, Retain, SetAttrs
from app.state_machine.reader import StreamReader
from app.storage.kv import Batch


class HistoryRules(StreamReader):
    # Provided by StateMachine.
    _batch: Batch
    _dirty: set[int]
    _changed: set[int]
    untiered_bytes: int
    local_bytes: int

    def _live(self, bucket: str, name: str, now: int, touched: int = 0) -> r.StreamMeta | None:
        raise NotImplementedError

    def _stage(self, cf: str, key: bytes, value: bytes) -> None:
        raise NotImplementedError

    def _enqueue_object(self, key: str) -> None:
        raise NotImplementedError

    def _enqueue_deletion(self, segment_key: str) -> None:
        raise NotImplementedError

    def _existing(self, bucket: str, name: str, now: int) -> r.StreamMeta | Outcome:
        meta = self._live(bucket, name, now)
        if meta is None:
            return Outcome(Code.NOT_FOUND)
        if meta.deleted:
            return Outcome(Code.GONE)
        return meta

    def snapshot_at(self, sid: int, pos: int) -> r.PublishedSnapshot | None:
        key = r.data_key(sid, pos)
        raw = self.staged.get((r.STREAM_SNAPSHOTS, key)) or self.kv.get(r.STREAM_SNAPSHOTS, key)
        return None if raw is None else r.decode_snapshot(raw)

    def _history(self, meta: r.StreamMeta, code: Code, message: str = "") -> Outcome:
        return Outcome(code, message, sid=meta.sid, next_pos=meta.tail, closed=meta.closed, earliest=meta.earliest)

    # Attributes

    def _set_attrs(self, cmd: SetAttrs, now: int) -> Outcome:
        meta = self._existing(cmd.bucket, cmd.stream, now)
        if isinstance(meta, Outcome):
            return meta
        meta.attrs = cmd.attrs  # closed streams too; offsets and ETags do not change
        self._dirty.add(meta.sid)
        return self._history(meta, Code.OK)

    # Snapshots

    def _publish_snapshot(self, cmd: PublishSnapshot, now: int) -> Outcome:
        meta = self._existing(cmd.bucket, cmd.stream, now)
        if isinstance(meta, Outcome):
            return meta
        if cmd.pos > meta.tail:
            return self._history(meta, Code.BEYOND_TAIL, "the snapshot offset is past the stream's tail")
        if cmd.pos < meta.earliest:
            return self._history(meta, Code.TRIMMED, "the snapshot offset is before the retained history")
        if not self.is_boundary(meta, cmd.pos):
            return self._history(meta, Code.NOT_BOUNDARY, "the snapshot offset is not a message boundary")
        existing = self.snapshot_at(meta.sid, cmd.pos)
        if existing is not None:
            if existing.sha256 != cmd.sha256:
                return self._history(meta, Code.SNAPSHOT_CONFLICT, "a different snapshot exists at this offset")
            return self._snapshot_outcome(meta, Code.EXISTS, cmd.pos, existing.sha256)
        if cmd.match is not None:
            latest = self.snapshot_at(meta.sid, meta.latest_snapshot) if meta.latest_snapshot is not None else None
            if latest is None or latest.sha256 != cmd.match:
                return self._history(meta, Code.SNAPSHOT_MISMATCH, "the latest snapshot does not match")
        snapshot = r.PublishedSnapshot(cmd.content_type, cmd.sha256, cmd.size, now, cmd.inline, cmd.key)
        self._stage(r.STREAM_SNAPSHOTS, r.data_key(meta.sid, cmd.pos), r.encode(snapshot))
        if cmd.key is not None:
            self._batch.delete(r.GC_QUEUE, cmd.key.encode())  # the same content may have been queued
        if meta.latest_snapshot is None or cmd.pos > meta.latest_snapshot:
            meta.latest_snapshot = cmd.pos
        self._dirty.add(meta.sid)
        return self._snapshot_outcome(meta, Code.CREATED, cmd.pos, cmd.sha256)

    def _snapshot_outcome(self, meta: r.StreamMeta, code: Code, pos: int, sha256: str) -> Outcome:
        outcome = self._history(meta, code)
        outcome.snapshot_pos, outcome.snapshot_sha256 = pos, sha256
        return outcome

    def _delete_snapshot(self, cmd: DeleteSnapshot, now: int) -> Outcome:
        meta = self._existing(cmd.bucket, cmd.stream, now)
        if isinstance(meta, Outcome):
            return meta
        existing = self.snapshot_at(meta.sid, cmd.pos)
        if existing is None:
            return self._history(meta, Code.SNAPSHOT_NOT_FOUND, "no snapshot at this offset")
        if cmd.pos == meta.latest_snapshot:
            return self._history(meta, Code.SNAPSHOT_LATEST, "the latest snapshot cannot be deleted")
        key = r.data_key(meta.sid, cmd.pos)
        self._batch.delete(r.STREAM_SNAPSHOTS, key)
        self.staged.pop((r.STREAM_SNAPSHOTS, key), None)
        if existing.key is not None and existing.key not in self._snapshot_keys(meta.sid, but=cmd.pos):
            self._enqueue_object(existing.key)
        return self._history(meta, Code.DELETED)

    def _snapshot_keys(self, sid: int, but: int | None = None) -> set[str]:
        """Object keys of the stream's snapshots, other than the one at `but` (content-addressed, so
        two offsets may share one)."""
        found = dict(self.kv.scan(r.STREAM_SNAPSHOTS, r.sid_key(sid), r.sid_key(sid + 1)))
        found.update(
            {k: v for (cf, k), v in self.staged.items() if cf == r.STREAM_SNAPSHOTS and k[:8] == r.sid_key(sid)}
        )
        if but is not None:
            found.pop(r.data_key(sid, but), None)
        keys = (r.decode_snapshot(raw).key for raw in found.values())
        return {k for k in keys if k is not None}

    def _drop_snapshots(self, sid: int) -> None:
        """A hard-deleted stream's snapshots, and their objects."""
        keys = self._snapshot_keys(sid)
        self._batch.delete_range(r.STREAM_SNAPSHOTS, r.sid_key(sid), r.sid_key(sid + 1))
        for key in sorted(keys):
            self._enqueue_object(key)

    # Retention

    def _retain(self, cmd: Retain, now: int) -> Outcome:
        meta = self._existing(cmd.bucket, cmd.stream, now)
        if isinstance(meta, Outcome):
            return meta
        pos = cmd.pos
        if cmd.auto and meta.latest_snapshot is not None:
            pos = min(pos, meta.latest_snapshot)
        if pos > meta.tail:
            return self._history(meta, Code.BEYOND_TAIL, "the retention offset is past the stream's tail")
        if pos < meta.earliest:
            return self._history(meta, Code.RETENTION_BACKWARDS, "retention never moves backwards")
        if pos == meta.earliest:
            return self._history(meta, Code.OK)
        if not self.is_boundary(meta, pos):
            return self._history(meta, Code.NOT_BOUNDARY, "the retention offset is not a message boundary")
        if meta.latest_snapshot is not None and pos > meta.latest_snapshot:
            return self._history(meta, Code.BEYOND_SNAPSHOT, "retention may not pass the latest snapshot")
        self._trim(meta, pos)
        meta.earliest = pos
        self._dirty.add(meta.sid)
        self._changed.add(meta.sid)
        return self._history(meta, Code.OK)

    def _trim(self, meta: r.StreamMeta, pos: int) -> None:
        """Deletes own records below `pos`, locally and (through the queue) in the object store.

        A stream with forks keeps its data: a fork reads below its fork point from it.
        """
        lo, sid = meta.fork_pos, meta.sid
        if meta.forks > 0 or pos <= lo:
            return
        self._batch.delete_range(r.DATA, r.data_key(sid, lo), r.data_key(sid, pos))
        self.local_bytes -= max(0, pos - max(meta.evicted, lo))
        self.untiered_bytes -= max(0, pos - max(meta.tiered, lo))
        for segment in list(self.segments(sid, lo, pos)):
            if segment.hi <= pos:
                key = r.data_key(sid, segment.lo)
                self._batch.delete(r.SEGMENTS, key)
                self.staged.pop((r.SEGMENTS, key), None)
                self._enqueue_object(segment.key)
        meta.tiered = max(meta.tiered, pos)
        meta.evicted = max(meta.evicted, pos)
