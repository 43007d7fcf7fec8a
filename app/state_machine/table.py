"""The applied state every rule reads and writes: the store, the streams, and the batch being staged.

Rules write only through the batch of the apply in progress; `commit` writes it together with the
new applied index in one KV write batch, so a crash never leaves an entry half-applied. Staged
writes and deletes are seen by later entries of the same batch (`get`, `scan`): a replica batches
entries as they reach it, and each must end in the same state as one that applied them one by one.
"""

from __future__ import annotations

from collections.abc import Iterator

from app.raft.messages import Membership, decode_membership
from app.state_machine import records as r
from app.state_machine.coverage import Coverage
from app.state_machine.tail import TailCache
from app.state_machine.upkeep import Upkeep
from app.storage.kv import KV, Batch, Parts, joined

# Buckets that always exist: the legacy and compat route families live here.
# Their names contain a dot, which user bucket names cannot.
LEGACY_BUCKET = "legacy.streams"
COMPAT_BUCKET = "compat.v1"
BUILTIN_BUCKETS = (LEGACY_BUCKET, COMPAT_BUCKET)


class StreamTable:
    def __init__(self, kv: KV, tail: TailCache | None = None) -> None:
        self.kv = kv
        self.tail = tail if tail is not None else TailCache()
        self.streams: dict[int, r.StreamMeta] = {}
        self.names: dict[tuple[str, str], int] = {}
        self.batch = Batch()
        # Writes of the apply batch in progress, not yet in the KV: (cf, key) -> value, or None for a
        # key the batch deletes (later entries of the batch must not find it in the KV).
        self.staged: dict[tuple[str, bytes], bytes | Parts | None] = {}
        # Streams whose metadata the batch must write, and streams whose live readers must re-check.
        self.dirty: set[int] = set()
        self.changed: set[int] = set()
        self.applied_index, self.applied_term = r.decode_applied(kv.get(r.SM_META, r.APPLIED_KEY))
        self.index = self.applied_index  # the entry being applied (what the deletion queue notes)
        raw = kv.get(r.SM_META, r.MEMBERSHIP_KEY)
        self.membership: Membership | None = decode_membership(raw) if raw else None
        raw = kv.get(r.SM_META, r.NEXT_SID_KEY)
        self.next_sid: int = r.U64.unpack(raw)[0] if raw else 1
        self.buckets: dict[str, int] = {b: 0 for b in BUILTIN_BUCKETS}
        # bucket -> (max-age, max-bytes) given to its streams that set no retention of their own
        self.bucket_retention: dict[str, tuple[int | None, int | None]] = {}
        for key, value in kv.scan(r.BUCKETS, b""):
            self.buckets[key.decode()] = r.U64.unpack_from(value)[0]
            if len(value) > r.U64.size:
                self.bucket_retention[key.decode()] = r.decode_retention(value[r.U64.size :])
        # Bytes of own records not yet in the object store, and still on local disk.
        self.untiered_bytes = self.local_bytes = 0
        self.upkeep = Upkeep()
        # bucket -> [streams, bytes of their own records kept]: what quotas measure, kept as it changes
        self.usage: dict[str, list[int]] = {}
        for _, value in kv.scan(r.STREAMS, b""):
            meta = r.decode_meta(value)
            if meta.tiered < meta.fork_pos:  # written before the cold tier existed
                meta.tiered = meta.evicted = meta.fork_pos
            self.streams[meta.sid] = meta
            self.names[(meta.bucket, meta.name)] = meta.sid
            self.untiered_bytes += meta.tail - meta.tiered
            self.local_bytes += meta.tail - meta.evicted
            self.upkeep.note(meta)
            self.count_usage(meta.bucket, 1, kept(meta))
        # bucket -> bytes of its streams' published snapshots (quotas count them with the records)
        self.snapshot_bytes: dict[str, int] = {}
        # sid -> {object key: snapshots naming it}, and sid -> bytes of its snapshots (app/state_machine/snapshots.py)
        self.snapshot_objects: dict[int, dict[str, int]] = {}
        self.snapshot_sizes: dict[int, int] = {}
        for key, value in kv.scan(r.STREAM_SNAPSHOTS, b""):
            sid, snapshot = r.U64.unpack_from(key)[0], r.decode_snapshot(value)
            owner = self.streams.get(sid)
            self.index_snapshot(sid, owner.bucket if owner is not None else None, snapshot, 1)
        # Objects queued for deletion, kept as the queue changes (metrics must not count it per scrape).
        self.queued_objects = sum(1 for _ in kv.scan(r.GC_QUEUE, b""))
        # Streams the batch in progress created: not yet in the store's name index.
        self.created: list[r.StreamMeta] = []
        # Subscriptions whose positions of removed streams the entry being applied is to forget.
        self.forgotten: dict[bytes, set[str]] = {}
        # Streams the entry being applied wrote records to: the subscriptions covering them may wake.
        self.grown: list[int] = []
        self.coverage = Coverage()
        for key, value in kv.scan(r.SUBSCRIPTIONS, b""):
            self.cover(key, r.decode_subscription(value))

    def get(self, cf: str, key: bytes) -> bytes | None:
        """A value as the batch in progress sees it: staged (or deleted), else committed."""
        if (cf, key) not in self.staged:
            return self.kv.get(cf, key)
        staged = self.staged[(cf, key)]
        return None if staged is None else joined(staged)

    def scan(self, cf: str, start: bytes, end: bytes) -> dict[bytes, bytes]:
        """The values of keys in [start, end) as the batch in progress sees them, by key (unordered)."""
        found = dict(self.kv.scan(cf, start, end))
        self.overlay(found, cf, start, end)
        return found

    def overlay(self, found: dict[bytes, bytes], cf: str, start: bytes, end: bytes) -> None:
        """Brings `found`, values read from the KV, up to the batch's writes of keys in [start, end)."""
        for (staged_cf, key), value in self.staged.items():  # bounded by the batch's size
            if staged_cf == cf and start <= key < end:
                if value is None:
                    found.pop(key, None)
                else:
                    found[key] = joined(value)

    def stage(self, cf: str, key: bytes, value: bytes | Parts) -> None:
        """Writes into the batch and keeps it readable by later entries of the same batch."""
        self.batch.put(cf, key, value)
        self.staged[(cf, key)] = value
        if cf == r.PACKS:
            self.upkeep.packs.add(key.decode())

    def unstage(self, cf: str, key: bytes) -> None:
        """Deletes a key in the batch: later entries of the batch see it gone."""
        self.batch.delete(cf, key)
        self.staged[(cf, key)] = None
        if cf == r.PACKS:
            self.upkeep.packs.add(key.decode())

    def new_sid(self) -> int:
        sid = self.next_sid
        self.next_sid += 1
        return sid

    def insert(self, meta: r.StreamMeta) -> None:
        self.streams[meta.sid] = meta
        self.names[(meta.bucket, meta.name)] = meta.sid
        self.batch.put(r.NAMES, r.name_key(meta.bucket, meta.name), r.sid_key(meta.sid))
        self.created.append(meta)
        self.coverage.stream_added(meta)
        self.count_usage(meta.bucket, 1, kept(meta))
        self.upkeep.added.add(meta.sid)

    def stored_streams(self, bucket: str, prefix: str = "", after: str = "") -> Iterator[r.StreamMeta]:
        """Streams of a bucket in name order, from the committed store."""
        start = r.name_key(bucket, max(prefix, after))
        end = r.name_key(bucket, prefix) + b"\xff" if prefix else bucket.encode() + b"\x01"
        for key, value in self.kv.scan(r.NAMES, start, end):
            if after and r.split_name_key(key)[1] <= after:
                continue
            meta = self.streams.get(r.U64.unpack(value)[0])
            if meta is not None:
                yield meta

    def streams_under(self, bucket: str, prefix: str) -> Iterator[r.StreamMeta]:
        """The streams of a bucket whose names start with `prefix`, those of the batch in progress included."""
        yield from self.stored_streams(bucket, prefix)
        for meta in self.created:
            if meta.bucket == bucket and meta.name.startswith(prefix) and self.streams.get(meta.sid) is meta:
                yield meta

    def cover(self, key: bytes, sub: r.Subscription) -> None:
        """Brings the coverage index up to a subscription as saved."""
        self.coverage.put(key, sub, self.streams_under)

    def drop(self, meta: r.StreamMeta) -> None:
        """Forgets a stream's metadata and name (its records are the caller's to delete)."""
        del self.streams[meta.sid]
        self.tail.drop(meta.sid)
        del self.names[(meta.bucket, meta.name)]
        self.coverage.stream_dropped(meta)
        self.upkeep.forget(meta)
        self.count_usage(meta.bucket, -1, -kept(meta))
        self.dirty.discard(meta.sid)
        self.batch.delete(r.NAMES, r.name_key(meta.bucket, meta.name))
        self.batch.delete(r.STREAMS, r.sid_key(meta.sid))

    def count_usage(self, bucket: str, streams: int, kept: int) -> None:
        usage = self.usage.setdefault(bucket, [0, 0])
        usage[0] += streams
        usage[1] += kept
        if not usage[0]:
            del self.usage[bucket]

    def index_snapshot(self, sid: int, bucket: str | None, snapshot: r.PublishedSnapshot, sign: int) -> bool:
        """Counts a snapshot of stream `sid` published (1) or deleted (-1), in its bucket's bytes too;
        True when that was the last snapshot of the stream to name its object, which may then go."""
        if bucket is not None:
            self.count_snapshot(bucket, sign * snapshot.size)
        size = self.snapshot_sizes.get(sid, 0) + sign * snapshot.size
        if size:
            self.snapshot_sizes[sid] = size
        else:
            self.snapshot_sizes.pop(sid, None)
        if snapshot.key is None:
            return False
        objects = self.snapshot_objects.setdefault(sid, {})
        count = objects.get(snapshot.key, 0) + sign
        if count > 0:
            objects[snapshot.key] = count
            return False
        objects.pop(snapshot.key, None)
        if not objects:
            del self.snapshot_objects[sid]
        return True

    def forget_snapshots(self, sid: int, bucket: str | None) -> list[str]:
        """Takes a removed stream's snapshots out of the counts; the object keys they named."""
        size = self.snapshot_sizes.pop(sid, 0)
        if bucket is not None and size:
            self.count_snapshot(bucket, -size)
        return sorted(self.snapshot_objects.pop(sid, {}))

    def count_snapshot(self, bucket: str, size: int) -> None:
        total = self.snapshot_bytes.get(bucket, 0) + size
        if total:
            self.snapshot_bytes[bucket] = total
        else:
            self.snapshot_bytes.pop(bucket, None)

    def set_membership(self, data: bytes) -> None:
        self.membership = decode_membership(data)
        self.batch.put(r.SM_META, r.MEMBERSHIP_KEY, data)

    def commit(self, index: int, term: int) -> set[int]:
        """Writes the batch with the applied point, and returns the streams it changed."""
        self.applied_index, self.applied_term = index, term
        for sid in self.dirty:
            meta = self.streams.get(sid)
            if meta is not None:
                self.batch.put(r.STREAMS, r.sid_key(sid), r.encode(meta))
                self.upkeep.note(meta)  # a failed write reloads the table, and this with it
        self.batch.put(r.SM_META, r.APPLIED_KEY, r.encode_applied(index, term))
        self.batch.put(r.SM_META, r.NEXT_SID_KEY, r.U64.pack(self.next_sid))
        try:
            self.kv.write(self.batch)
        except BaseException:
            self.tail.discard_staged()
            raise
        self.tail.commit()
        self.batch, self.dirty = Batch(), set()
        self.staged.clear()
        self.created.clear()
        changed, self.changed = self.changed, set()
        self.coverage.wake(self.streams[sid] for sid in changed if sid in self.streams)
        return changed


def kept(meta: r.StreamMeta) -> int:
    """Bytes of the stream's own records it still keeps (what a bucket's byte quota counts)."""
    return max(0, meta.tail - max(meta.fork_pos, meta.earliest))
