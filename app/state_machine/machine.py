"""The replicated state machine: deterministic apply of committed commands, and queries over the result.

Every replica applies the same entries in the same order and ends in the same state. Apply uses
only the entry's stamped `now`, and writes each batch of entries together with the new applied
index in one KV write batch, so a crash never leaves an entry half-applied.

`StateMachine` is a facade: the state lives in one `StreamTable`, each command's rule in the module
of its concept, and the queries in `reader`.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Collection, Iterator
from typing import Any

from app.raft.messages import MEMBERSHIP, Entry, Membership
from app.state_machine import buckets, cold_tier, expiry, history, reader, snapshots, streams, subscriptions
from app.state_machine import records as r
from app.state_machine.cold_tier import manifest_of
from app.state_machine.commands import (
    Ack,
    Append,
    AppendBatch,
    Claim,
    CollectExpired,
    CreateBucket,
    CreateStream,
    DeleteBucket,
    DeleteSnapshot,
    DeleteStream,
    DeleteSubscription,
    Envelope,
    Evict,
    ForgetObjects,
    LinkStreams,
    MergeSegments,
    Outcome,
    PublishSnapshot,
    PutSubscription,
    Retain,
    SetAttrs,
    TierPack,
    TierSegment,
    Touch,
    Wake,
    decode_envelope,
)
from app.state_machine.reader import Chunk, ColdSource
from app.state_machine.table import BUILTIN_BUCKETS, COMPAT_BUCKET, LEGACY_BUCKET, StreamTable
from app.state_machine.tail import TailCache
from app.state_machine.upkeep import Upkeep
from app.storage.kv import KV, Batch

__all__ = ["BUILTIN_BUCKETS", "COMPAT_BUCKET", "LEGACY_BUCKET", "StateMachine", "manifest_of"]

Rule = Callable[[StreamTable, Any, int], Outcome]

RULES: dict[type, Rule] = {
    CreateBucket: buckets.create_bucket,
    DeleteBucket: buckets.delete_bucket,
    CreateStream: streams.create_stream,
    Append: streams.append,
    AppendBatch: streams.append_batch,
    DeleteStream: streams.delete_stream,
    Touch: expiry.touch,
    CollectExpired: expiry.collect_expired,
    SetAttrs: history.set_attrs,
    Retain: history.retain,
    PublishSnapshot: history.publish_snapshot,
    DeleteSnapshot: history.delete_snapshot,
    TierSegment: cold_tier.tier_segment,
    TierPack: cold_tier.tier_pack,
    MergeSegments: cold_tier.merge_segments,
    Evict: cold_tier.evict,
    ForgetObjects: cold_tier.forget_objects,
    PutSubscription: subscriptions.put_subscription,
    DeleteSubscription: subscriptions.delete_subscription,
    LinkStreams: subscriptions.link_streams,
    Claim: subscriptions.claim,
    Ack: subscriptions.ack,
    Wake: subscriptions.wake,
}


class StateMachine:
    def __init__(
        self,
        kv: KV,
        on_change: Callable[[set[int]], None] | None = None,
        tail_cache_bytes: int = 64 << 20,
        tail_stream_bytes: int = 4 << 20,
    ) -> None:
        self._tail_sizes = (tail_cache_bytes, tail_stream_bytes)
        self.table = StreamTable(kv, TailCache(*self._tail_sizes))
        # Called after each apply (and reload) with the streams whose live readers must re-check.
        self.on_change = on_change
        # Called after an apply that woke subscriptions (their streams grew, or they changed).
        self.on_woken: Callable[[], None] | None = None
        # The latest time a command applied here was stamped with: this node, leading later, never
        # stamps an earlier one (app/service/clock.py).
        self.latest_now = 0

    def reload(self, kv: KV) -> None:
        """Starts over from another store: a snapshot installed from the leader."""
        before = set(self.streams)
        self.table = StreamTable(kv, TailCache(*self._tail_sizes))
        self.table.coverage.woken.update(self.table.coverage.scopes)
        if self.on_change is not None:
            self.on_change(before | set(self.streams))

    def apply(self, entries: list[Entry], known: dict[int, Envelope] | None = None) -> list[Outcome | None]:
        """Applies committed entries; `known` holds some of them already decoded, by index."""
        table = self.table
        results: list[Outcome | None] = []
        for entry in entries:
            if entry.kind == MEMBERSHIP:
                table.set_membership(entry.data)
                results.append(None)
            elif not entry.data:
                results.append(None)
            else:
                table.index = entry.index
                env = known.get(entry.index) if known else None
                if env is None:
                    env = decode_envelope(entry.data)
                results.append(RULES[type(env.command)](table, env.command, env.now))
                if env.now > self.latest_now:
                    self.latest_now = env.now
                if table.forgotten:
                    subscriptions.forget_positions(table)
                if table.grown:  # per entry, not per batch: replicas batch entries differently
                    subscriptions.wake_covering(table, env.now)
                    if table.forgotten:  # a wake's append collected an expired stream
                        subscriptions.forget_positions(table)
        changed = table.commit(entries[-1].index, entries[-1].term)
        if changed and self.on_change is not None:
            self.on_change(changed)
        if table.coverage.woken and self.on_woken is not None:
            self.on_woken()
        return results

    def make_durable(self) -> None:
        """Syncs the store's log, so every apply written before this call survives a crash.

        It may run on another thread than apply, so it writes a marker, never the applied index.
        """
        batch = Batch()
        batch.put(r.SM_META, r.SYNCED_KEY, b"")
        self.kv.write(batch, sync=True)

    @property
    def kv(self) -> KV:
        return self.table.kv

    @property
    def streams(self) -> dict[int, r.StreamMeta]:
        return self.table.streams

    @property
    def names(self) -> dict[tuple[str, str], int]:
        return self.table.names

    @property
    def buckets(self) -> dict[str, int]:
        return self.table.buckets

    @property
    def next_sid(self) -> int:
        return self.table.next_sid

    @property
    def upkeep(self) -> Upkeep:
        """The streams each periodic chore may have work for (a new object after a reload)."""
        return self.table.upkeep

    @property
    def untiered_bytes(self) -> int:
        return self.table.untiered_bytes

    @property
    def local_bytes(self) -> int:
        return self.table.local_bytes

    # Settable, as the Raft driver's view of a state machine declares them; only apply changes them.
    @property
    def applied_index(self) -> int:
        return self.table.applied_index

    @applied_index.setter
    def applied_index(self, index: int) -> None:
        self.table.applied_index = index

    @property
    def applied_term(self) -> int:
        return self.table.applied_term

    @applied_term.setter
    def applied_term(self, term: int) -> None:
        self.table.applied_term = term

    @property
    def membership(self) -> Membership | None:
        return self.table.membership

    @membership.setter
    def membership(self, membership: Membership | None) -> None:
        self.table.membership = membership

    def lookup(self, bucket: str, name: str) -> r.StreamMeta | None:
        return reader.lookup(self.table, bucket, name)

    def bucket_names(self, start: str = "") -> Iterator[str]:
        """The buckets' names from `start` on, in order: the store keeps them sorted (the built-in
        ones, which it does not hold, merged in), so a page of a listing costs what it holds."""
        stored = (key.decode() for key, _ in self.kv.scan(r.BUCKETS, start.encode()))
        return heapq.merge(sorted(b for b in BUILTIN_BUCKETS if b >= start), stored)

    def bucket_streams(self, bucket: str, prefix: str = "", after: str = "") -> Iterator[r.StreamMeta]:
        return reader.bucket_streams(self.table, bucket, prefix, after)

    def bucket_usage(self, bucket: str) -> tuple[int, int]:
        """(streams, bytes of their own records still kept and of their snapshots) of a bucket, for quotas."""
        streams, kept = self.table.usage.get(bucket, (0, 0))
        return streams, kept + self.table.snapshot_bytes.get(bucket, 0)

    def owner(self, meta: r.StreamMeta, pos: int) -> r.StreamMeta:
        return reader.owner(self.table, meta, pos)

    def segment_at(self, sid: int, pos: int) -> r.SegmentInfo | None:
        return reader.segment_at(self.table, sid, pos)

    def segments(self, sid: int, lo: int, hi: int) -> Iterator[r.SegmentInfo]:
        return reader.segments(self.table, sid, lo, hi)

    def ranges(self, meta: r.StreamMeta, start: int, end: int) -> list[tuple[int, int, int]]:
        """(sid, lo, hi): whose records make up positions [start, end) of the stream (a fork's sources')."""
        return reader.ranges(self.table, meta, start, end)

    def is_boundary(self, meta: r.StreamMeta, pos: int) -> bool:
        return reader.is_boundary(self.table, meta, pos)

    def record_length(self, meta: r.StreamMeta, pos: int) -> int | None:
        return reader.record_length(self.table, meta, pos)

    def record_prefix(
        self, meta: r.StreamMeta, pos: int, count: int, evicted_record: bytes | None = None
    ) -> bytes | None:
        return reader.record_prefix(self.table, meta, pos, count, evicted_record)

    def read(
        self, meta: r.StreamMeta, pos: int, max_bytes: int, cold: ColdSource | None = None, whole: bool = False
    ) -> Chunk:
        return reader.read(self.table, meta, pos, max_bytes, cold, whole)

    def evicted_span(self, meta: r.StreamMeta, pos: int) -> tuple[r.StreamMeta, int]:
        return reader.evicted_span(self.table, meta, pos)

    def local_records(
        self, meta: r.StreamMeta, pos: int, max_bytes: int, max_records: int = 0
    ) -> tuple[list[tuple[int, bytes]], int] | None:
        return reader.local_records(self.table, meta, pos, max_bytes, max_records)

    def snapshot_at(self, sid: int, pos: int) -> r.PublishedSnapshot | None:
        return snapshots.snapshot_at(self.table, sid, pos)

    def subscription_keys(self) -> Iterator[bytes]:
        """Every subscription's key (a new leader looks at each once)."""
        return (key for key, _ in self.kv.scan(r.SUBSCRIPTIONS, b""))

    @property
    def queued_objects(self) -> int:
        """How many objects are queued for deletion."""
        return self.table.queued_objects

    def deletion_queue(self) -> Iterator[str]:
        """Object keys queued for deletion, in key order."""
        return (key.decode() for key, _ in self.kv.scan(r.GC_QUEUE, b""))

    def deletion_entries(self, start: str = "") -> Iterator[tuple[str, int]]:
        """(key, the index of the entry that queued it) for each object queued for deletion from key
        `start` on, in key order; 0 for one queued before the index was noted."""
        scanned = self.kv.scan(r.GC_QUEUE, start.encode())
        return ((key.decode(), r.U64.unpack(v)[0] if len(v) == 8 else 0) for key, v in scanned)

    def queued_for_deletion(self, key: str) -> bool:
        return self.kv.get(r.GC_QUEUE, key.encode()) is not None

    def record_head(self, sid: int, pos: int) -> bytes | None:
        """The header of the local record at `pos` (its time, producer), without reading its payload."""
        start, end = r.data_key(sid, pos), r.data_key(sid, pos + 1)
        return next((head for _, head in self.kv.scan_heads(r.DATA, start, end, r.RECORD_HEADER_SIZE)), None)

    def stored_records(self, sid: int, lo: int, hi: int) -> Iterator[tuple[int, bytes]]:
        """(position, stored record) of the stream's own local records in [lo, hi), in order."""
        return (
            (r.data_pos(key), value) for key, value in self.kv.scan(r.DATA, r.data_key(sid, lo), r.data_key(sid, hi))
        )

    def pack(self, key: str) -> r.PackInfo | None:
        raw = self.kv.get(r.PACKS, key.encode())
        return None if raw is None else r.decode_pack(raw)

    def packs(self) -> Iterator[tuple[str, r.PackInfo]]:
        """Every pack still recorded, in key order (one per many small streams' slices)."""
        return ((key.decode(), r.decode_pack(value)) for key, value in self.kv.scan(r.PACKS, b""))

    def pack_slices(self, key: str) -> Iterator[tuple[int, int]]:
        """(sid, first position) of the pack's live slices."""
        start = key.encode() + b"\0"
        return (r.packed_slice(k) for k, _ in self.kv.scan(r.PACKED, start, start[:-1] + b"\1"))

    def snapshot_keys(self, sid: int) -> Collection[str]:
        """Object keys the stream's published snapshots name (the tiering worker keeps those objects)."""
        return snapshots.snapshot_keys(self.table, sid)
