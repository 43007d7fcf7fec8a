"""The leader's tiering loop: seal segments, upload them, record them through Raft, publish
manifests, evict local copies under the disk budget, and work off the deletion queue.

One task does all of it in sequence, so on a node an upload, a manifest write and a deletion
never race for the same key. Across leaders, a deletion runs only after a read barrier (the
leader has applied everything committed, its own term included) and only for keys the
replicated state no longer references; re-tiering a key takes it off the queue in the same apply.
An upload whose proposal has an ambiguous outcome is left alone: it may yet be committed.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import unquote

from app.domain.errors import ProtocolError
from app.domain.offsets import format_offset
from app.state_machine import records as r
from app.state_machine.commands import Code, Command, Evict, ForgetObjects, Outcome, Retain, TierSegment
from app.state_machine.machine import StateMachine
from app.state_machine.records import SegmentInfo, StreamMeta
from app.tiering import segment as seg
from app.tiering.retention import retention_target
from app.tiering.store import ObjectStore, StoreUnavailable, sha256_hex

log = logging.getLogger("rill.tiering")


@dataclass
class TieringConfig:
    segment_max_bytes: int = 8 << 20
    segment_max_age: float = 60.0  # seconds after the first unsealed byte
    segment_max_records: int = 100_000  # bounds the boundary list a TierSegment entry carries
    local_disk_budget: int = 1 << 30
    interval: float = 0.5


class Proposer(Protocol):
    """What the worker needs of its node: the applied state, a clock, and a way to propose."""

    machine: StateMachine
    uploading: set[str]  # keys being uploaded by others (snapshot publishes): never collected

    @property
    def is_leader(self) -> bool: ...

    def now_ms(self) -> int: ...

    async def submit(self, command: Command) -> Outcome: ...

    async def read_barrier(self) -> None: ...


class TieringWorker:
    def __init__(self, node: Proposer, store: ObjectStore, config: TieringConfig) -> None:
        self.node = node
        self.machine = node.machine
        self.store = store
        self.config = config
        self.available = True
        self.last_error: str | None = None
        self.uploaded = 0
        # name -> (sid, tiered, earliest) as its published manifest shows them
        self._published: dict[tuple[str, str], tuple[int, int, int]] = {}

    def status(self) -> dict[str, Any]:
        return {
            "store": self.store.url,
            "available": self.available,
            "last_error": self.last_error,
            "untiered_bytes": self.machine.untiered_bytes,
            "local_bytes": self.machine.local_bytes,
            "deletion_queue": sum(1 for _ in self.machine.kv.scan(r.GC_QUEUE, b"")),
            "segments_uploaded": self.uploaded,
        }

    async def run_forever(self) -> None:
        while True:
            await asyncio.sleep(self.config.interval)
            if not self.node.is_leader:
                self._published.clear()  # a later term republishes every manifest
                continue
            try:
                await self.run_once()
                self.available, self.last_error = True, None
            except StoreUnavailable as exc:
                if self.available:
                    log.warning("object store unavailable: %s", exc)
                self.available, self.last_error = False, str(exc)
            except ProtocolError as exc:
                log.info("tiering deferred: %s", exc.message)
            except Exception:  # a bug must not stop tiering for good; the next pass starts over
                log.exception("tiering pass failed")

    async def run_once(self) -> None:
        """One pass: everything due is tiered, published, evicted and collected."""
        await self.node.read_barrier()
        for meta in sorted(self._due(), key=lambda m: m.sid):
            while self._is_due(meta) and self.machine.streams.get(meta.sid) is meta:
                if not await self._tier_one(meta):
                    break
        await self._retain()
        await self._publish_manifests()
        await self._evict()
        await self._collect()

    async def _retain(self) -> None:
        """Applies streams' automatic retention (max-age, max-bytes)."""
        now = self.node.now_ms()
        for meta in list(self.machine.streams.values()):
            if meta.deleted or (meta.retention_age is None and meta.retention_bytes is None):
                continue
            target = retention_target(self.machine, meta, now)
            if target is not None:
                await self.node.submit(Retain(meta.bucket, meta.name, target, auto=True))

    def _due(self) -> list[StreamMeta]:
        return [m for m in list(self.machine.streams.values()) if self._is_due(m)]

    def _is_due(self, meta: StreamMeta) -> bool:
        pending = meta.tail - meta.tiered
        if pending <= 0:
            return False
        if pending >= self.config.segment_max_bytes:
            return True
        first = self.machine.kv.get(r.DATA, r.data_key(meta.sid, meta.tiered))
        return first is not None and self.node.now_ms() - r.record_time(first) >= self.config.segment_max_age * 1000

    async def _tier_one(self, meta: StreamMeta) -> bool:
        built = await asyncio.to_thread(self._build, meta, meta.tiered, meta.tail)
        if built is None:
            return False
        segment, data = built
        await asyncio.to_thread(self._upload, segment, data)
        outcome = await self.node.submit(TierSegment(meta.sid, segment))
        if outcome.code is not Code.OK:
            log.info("segment %s was not recorded (%s)", segment.key, outcome.code.value)
            return False
        self.uploaded += 1
        return True

    def _build(self, meta: StreamMeta, lo: int, tail: int) -> tuple[SegmentInfo, bytes] | None:
        """The next segment from committed records at `lo`, and its file; None if they changed under us."""
        records: list[seg.Record] = []
        size, expected = 0, lo
        for key, value in self.machine.kv.scan(r.DATA, r.data_key(meta.sid, lo), r.data_key(meta.sid, tail)):
            pos, payload = r.data_pos(key), bytes(r.record_payload(value))
            if pos != expected:
                return None  # the stream was deleted or evicted meanwhile
            records.append(seg.Record(pos, r.record_time(value), payload, r.record_producer(value)))
            size += len(payload)
            expected = pos + len(payload)
            if size >= self.config.segment_max_bytes or len(records) >= self.config.segment_max_records:
                break
        if not records:
            return None
        times = [rec.time for rec in records]
        data = seg.build(meta.bucket, meta.name, meta.content_type, records)
        object_key = seg.segment_key(meta.bucket, meta.name, lo, expected)
        starts = r.encode_starts(lo, [rec.pos for rec in records])
        return SegmentInfo(lo, expected, object_key, len(data), sha256_hex(data), min(times), max(times), starts), data

    def _upload(self, segment: SegmentInfo, data: bytes) -> None:
        self.store.put(segment.key, data)
        info = self.store.stat(segment.key)
        if info is None or info.size != segment.size or info.sha256 not in (None, segment.sha256):
            raise StoreUnavailable(f"uploaded {segment.key} but the store holds something else")

    async def _publish_manifests(self) -> None:
        for meta in list(self.machine.streams.values()):
            name = (meta.bucket, meta.name)
            version = (meta.sid, meta.tiered, meta.earliest)
            if meta.tiered <= meta.fork_pos or self._published.get(name) == version:
                continue
            manifest = self._manifest(meta)
            await asyncio.to_thread(self.store.put, seg.manifest_key(*name), manifest.to_json())
            self._published[name] = version

    def _manifest(self, meta: StreamMeta) -> seg.Manifest:
        prefix = seg.stream_dir(meta.bucket, meta.name) + "/"
        entries = [
            seg.SegmentEntry(
                path=s.key.removeprefix(prefix),
                first_offset=format_offset(s.lo),
                next_offset=format_offset(s.hi),
                records=s.records,
                bytes=s.size,
                sha256=s.sha256,
                min_append_time=s.min_time,
                max_append_time=s.max_time,
            )
            for s in self.machine.segments(meta.sid, meta.fork_pos, meta.tiered)
        ]
        return seg.Manifest(meta.bucket, meta.name, meta.content_type, entries)

    async def _evict(self) -> None:
        """Drops local copies of tiered records, oldest streams first, until under the disk budget."""
        excess = self.machine.local_bytes - self.config.local_disk_budget
        if excess <= 0:
            return
        candidates = [m for m in self.machine.streams.values() if m.evicted < m.tiered]
        candidates.sort(key=lambda m: (m.touched_at, m.sid))
        for meta in candidates:
            if excess <= 0:
                return
            freed = meta.tiered - meta.evicted
            outcome = await self.node.submit(Evict(meta.sid, meta.tiered))
            if outcome.code is Code.OK:
                excess -= freed

    async def _collect(self) -> None:
        """Deletes queued objects that nothing references any more, then takes them off the queue."""
        keys = [key.decode() for key, _ in self.machine.kv.scan(r.GC_QUEUE, b"")][:1000]
        done = []
        for key in keys:
            if not self._referenced(key):
                await asyncio.to_thread(self.store.delete, key)
                self._published = {n: v for n, v in self._published.items() if seg.manifest_key(*n) != key}
            done.append(key)
        if done:
            await self.node.submit(ForgetObjects(done))

    def _referenced(self, key: str) -> bool:
        if key in self.node.uploading:
            return True
        if "/snapshots/" in key:
            bucket, _, stream = key.rpartition("/snapshots/")[0].partition("/")
            snapshot_owner = self.machine.lookup(bucket, unquote(stream))
            return snapshot_owner is not None and key in self.machine.snapshot_keys(snapshot_owner.sid)
        parsed = seg.parse_key(key)
        if parsed is None:
            return False
        bucket, stream, lo = parsed
        meta = self.machine.lookup(bucket, stream)
        if meta is None:
            return False
        if lo is None:  # the manifest: needed while the stream has segments of its own
            return meta.tiered > meta.fork_pos
        segment = self.machine.segment_at(meta.sid, lo)
        return segment is not None and segment.key == key
