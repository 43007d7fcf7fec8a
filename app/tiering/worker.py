"""The leader's tiering loop: seal segments, upload them, record them through Raft, publish
manifests, evict local copies under the disk budget, and work off the deletion queue.

One task does all of it in sequence, so on a node an upload, a manifest write and a deletion
never race for the same key. Across leaders, a deletion runs only after a read barrier (the
leader has applied everything committed, its own term included) and only for keys the
replicated state no longer references; re-tiering a key takes it off the queue in the same apply.
An upload whose proposal has an ambiguous outcome is left alone: it may yet be committed.

A failure of one stream's objects (the store rejects its keys) sets that stream aside with its own
exponential backoff; the pass goes on with the others. Only an outage (the store cannot be reached)
or a lost leadership stops the pass, as one stream cannot be told from another then.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import posixpath
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from app.counters.histogram import Histogram
from app.domain.errors import ProtocolError
from app.domain.media import DEFAULT_CONTENT_TYPE
from app.domain.offsets import format_offset
from app.runtime import blocking
from app.state_machine import records as r
from app.state_machine.cold_tier import is_pack
from app.state_machine.commands import Code, Evict, ForgetObjects, Retain, TierSegment
from app.state_machine.records import SegmentInfo, StreamMeta
from app.tiering import keys
from app.tiering import segment as seg
from app.tiering.backoff import Backoff
from app.tiering.packing import Packer
from app.tiering.proposer import Proposer, TieringConfig
from app.tiering.retention import RetentionSchedule, retention_target
from app.tiering.store import KeyRejected, ObjectStore, StoreUnavailable, sha256_hex, stops_a_pass

log = logging.getLogger("rill.tiering")

GC_SCAN = 10_000  # queued deletions a pass looks at
YIELD_EVERY = 1000  # streams looked at between two turns of the loop, where a pass visits them all
RETENTION_RETRY_MS = 60_000  # a stream whose retention could not be worked out is looked at again after this


class TieringWorker:
    def __init__(self, node: Proposer, store: ObjectStore, config: TieringConfig) -> None:
        self.node = node
        self.machine = node.machine
        self.store = store
        self.config = config
        self.available = True
        self.last_error: str | None = None
        self.uploaded = 0
        self.upload_errors = 0
        self.upload_seconds = Histogram()
        # name -> ((sid, tiered, earliest) as its published manifest shows them, the manifest's key)
        self._published: dict[tuple[str, str], tuple[tuple[int, int, int], str]] = {}
        self._published_at: dict[str, tuple[str, str]] = {}  # a manifest's key -> the name it was published for
        # Manifests of streams dropped since they were published: emptied at once, so that catalog readers
        # (Spark, restore) stop listing what the collector deletes only after the next backup.
        self._to_empty: dict[str, tuple[str, str]] = {}
        self._publish_all = True  # a new term checks every stream's manifest once
        self._republish: set[int] = set()  # sids whose manifest must be written again though they did not change
        # Streams (by sid) and queued deletions (by key) that failed on their own, and when to retry.
        self.failing: Backoff[int] = Backoff(config.retry_base, config.retry_max, config.retry_jitter)
        self.deletions: Backoff[str] = Backoff(config.retry_base, config.retry_max, config.retry_jitter)
        # (bucket, component) -> sid of the names long enough to be hashed: built once a term, then
        # kept up to date from the streams created and dropped since (Upkeep.take_names)
        self._hashed: dict[tuple[str, str], int] | None = None
        self._upkeep: object = node.machine.upkeep  # the state machine's, which a reload replaces
        # sid -> (tiered, the time of the record there): each pass would otherwise read it again.
        self._first_times: dict[int, tuple[int, int]] = {}
        self.oldest_unsealed: int | None = None  # ms: when the oldest record not yet in a segment was appended
        self.packer = Packer(node, store, config, self._upload)
        # The index of the newest state backup in the store (or of one being taken), None when there
        # is none: an object released by a later entry may be named by that backup, so it stays
        # until a newer backup is taken (set by the node: app/tiering/backups.py).
        self.backup_floor: Callable[[], int | None] = lambda: None
        self._gc_from = ""  # the queued key the next deletion pass starts at
        self.retention = RetentionSchedule()

    def status(self) -> dict[str, Any]:
        now = self.node.now_ms()
        return {
            "store": self.store.url,
            "available": self.available,
            "last_error": self.last_error,
            "untiered_bytes": self.machine.untiered_bytes,
            "local_bytes": self.machine.local_bytes,
            "deletion_queue": self.deletion_queue(),
            "segments_uploaded": self.uploaded,
            "packs_uploaded": self.packer.packed,
            "segments_merged": self.packer.merged,
            "failing": self.failing.report(now),
            "failing_count": len(self.failing.failures),
            "deletions_failing": self.deletions.report(now, limit=10),
            "deletions_failing_count": len(self.deletions.failures),
        }

    def deletion_queue(self) -> int:
        """Objects queued for deletion (counted as the queue changes: a scrape reads a number)."""
        return self.machine.queued_objects

    async def run_forever(self) -> None:
        while True:
            await asyncio.sleep(self.config.interval)
            if not self.node.is_leader:
                self._published.clear()  # a later term republishes every manifest and retries everything
                self._published_at.clear()
                self.failing.clear()
                self.deletions.clear()
                self.available, self.last_error = True, None  # the leader's passes report the store now
                self._look_again()
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
        self._follow_state()
        self.failing.keep_only(lambda sid: sid in self.machine.streams)
        now = self.node.now_ms()
        due = [meta for meta in sorted(self._due(), key=lambda m: m.sid) if self.failing.ready(meta.sid, now)]
        packed = await self._pack(due)
        for meta in due:
            if meta.sid not in packed:
                await self._isolated(meta, self._tier_stream)
        await self._retain()
        await self.packer.merge_due(self._dir, self._merged)  # first: what it releases is collected below
        await self._publish_manifests()
        await self.packer.publish_indexes()
        await self._evict()
        await self._collect()

    def _merged(self, meta: StreamMeta) -> None:
        self._published.pop((meta.bucket, meta.name), None)  # written again before the collector runs
        self._republish.add(meta.sid)

    async def _isolated(self, meta: StreamMeta, work: Callable[[StreamMeta], Awaitable[None]]) -> None:
        """Runs one stream's store work; a failure of that stream alone sets it aside until its next retry."""
        try:
            await work(meta)
        except Exception as exc:
            if stops_a_pass(exc):
                raise
            if not isinstance(exc, KeyRejected):
                log.exception("tiering %r/%r failed", meta.bucket, meta.name)
            error = str(exc) or type(exc).__name__
            failure = self.failing.failed(meta.sid, self.node.now_ms(), error, bucket=meta.bucket, stream=meta.name)
            log.warning(
                "tiering %s/%.100s failed (attempt %d, next in %.1fs): %s",
                meta.bucket, meta.name, failure.attempts, (failure.retry_at - self.node.now_ms()) / 1000, error,
            )  # fmt: skip
        else:
            self.failing.succeeded(meta.sid)

    async def _pack(self, due: list[StreamMeta]) -> set[int]:
        """Packs the small streams due, per bucket where two or more are; returns the sids packed."""
        by_bucket: dict[str, list[StreamMeta]] = {}
        for meta in due:
            if self.packer.takes(meta):
                by_bucket.setdefault(meta.bucket, []).append(meta)
        done: set[int] = set()
        for bucket, metas in by_bucket.items():
            if len(metas) < 2:
                continue
            try:
                done.update(meta.sid for meta in await self.packer.tier(bucket, metas))
            except Exception as exc:
                if isinstance(exc, ProtocolError) or (
                    isinstance(exc, StoreUnavailable) and not isinstance(exc, KeyRejected)
                ):
                    raise
                log.exception("packing %d streams of %r failed", len(metas), bucket)
                for meta in metas:  # each is retried on its own backoff, alone or in a later pack
                    self.failing.failed(meta.sid, self.node.now_ms(), str(exc) or type(exc).__name__,
                                        bucket=meta.bucket, stream=meta.name)  # fmt: skip
                    done.add(meta.sid)
        return done

    async def _tier_stream(self, meta: StreamMeta) -> None:
        while self._is_due(meta) and self.machine.streams.get(meta.sid) is meta:
            if not await self._tier_one(meta):
                return

    async def _retain(self) -> None:
        """Applies streams' automatic retention (max-age, max-bytes), to the streams due a look."""
        now = self.node.now_ms()
        streams = self.machine.streams
        due, n = self.retention.due(self.machine, now), 0
        try:
            for n, sid in enumerate(due):
                if n and n % YIELD_EVERY == 0:
                    await asyncio.sleep(0)
                meta = streams.get(sid)
                if meta is None or meta.deleted:
                    continue
                try:
                    target = retention_target(self.machine, meta, now)
                except Exception:  # this stream's records (a damaged one): the others go on
                    log.exception("retention of %r/%r failed", meta.bucket, meta.name)
                    self.retention.again(sid, now + RETENTION_RETRY_MS)
                    continue
                if target is not None:
                    await self.node.submit(Retain(meta.bucket, meta.name, target, auto=True))
                self.retention.checked(self.machine, meta, now)
        except BaseException:
            self.retention.retry(due[n:], now)  # the pass stopped: what it did not reach waits
            raise

    def _due(self) -> list[StreamMeta]:
        """The streams to seal now; on the way, notes when the oldest unsealed record was appended."""
        streams, untiered = self.machine.streams, list(self.machine.upkeep.untiered)
        due, oldest = [], None
        for sid in untiered:
            meta = streams.get(sid)
            if meta is not None and meta.tail > meta.tiered:
                first = self._first_time(meta)
                oldest = first if oldest is None else min(oldest, first)
                if self._is_due(meta):
                    due.append(meta)
        self.oldest_unsealed = oldest
        known = self._first_times
        self._first_times = {sid: known[sid] for sid in untiered if sid in known}  # a new dict: compact
        return due

    def _is_due(self, meta: StreamMeta) -> bool:
        pending = meta.tail - meta.tiered
        if pending <= 0:
            return False
        if pending >= self.config.segment_max_bytes:
            return True
        return self.node.now_ms() - self._first_time(meta) >= self.config.segment_max_age * 1000

    def _first_time(self, meta: StreamMeta) -> int:
        """When the first untiered record was appended (remembered until the stream tiers past it)."""
        known = self._first_times.get(meta.sid)
        if known is not None and known[0] == meta.tiered:
            return known[1]
        # The record's header only: a large record is not read whole.
        first = self.machine.record_head(meta.sid, meta.tiered)
        if first is None:  # not applied here yet (or trimmed meanwhile): not due, ask again next pass
            return self.node.now_ms()
        self._first_times[meta.sid] = (meta.tiered, r.record_time(first))
        return r.record_time(first)

    async def _tier_one(self, meta: StreamMeta) -> bool:
        built = await blocking.run("tiering", self._build, meta, meta.tiered, meta.tail, self._dir(meta))
        if built is None:
            return False
        segment, data = built
        await blocking.run("tiering", self._upload, segment, data)
        del data, built
        seg.release_memory()
        outcome = await self.node.submit(TierSegment(meta.sid, segment))
        if outcome.code is not Code.OK:
            log.info("segment %r was not recorded (%s)", segment.key, outcome.code.value)
            return False
        self.uploaded += 1
        self.packer.sealed_small(meta, segment)
        return True

    def _dir(self, meta: StreamMeta) -> str:
        """Where the stream's next objects go: beside its last segment, so a stream tiered under an older
        key layout keeps one directory (and one manifest); the current layout for a stream without any."""
        if meta.tiered > meta.fork_pos:
            last = self.machine.segment_at(meta.sid, meta.tiered - 1)
            if last is not None and "/segments/" in last.key:
                return keys.dir_of(last.key)
        return seg.stream_dir(meta.bucket, meta.name)

    def _build(self, meta: StreamMeta, lo: int, tail: int, directory: str) -> tuple[SegmentInfo, memoryview] | None:
        """The next segment from committed records at `lo`, and its file; None if they changed under us."""
        records: list[seg.Record] = []
        size, expected = 0, lo
        for pos, value in self.machine.stored_records(meta.sid, lo, tail):
            payload = r.record_payload(value)
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
        data = seg.build_view(meta.bucket, meta.name, meta.content_type, records)
        object_key = f"{directory}/segments/{format_offset(lo)}-{format_offset(expected)}.parquet"
        starts = r.encode_starts(lo, [rec.pos for rec in records])
        return SegmentInfo(lo, expected, object_key, len(data), sha256_hex(data), min(times), max(times), starts), data

    def _upload(self, segment: SegmentInfo, data: bytes | memoryview) -> None:
        started = time.perf_counter()
        try:
            self.store.put(segment.key, data)
            info = self.store.stat(segment.key)
            if info is None or info.size != segment.size or info.sha256 not in (None, segment.sha256):
                raise KeyRejected(f"uploaded {segment.key} but the store holds something else")
        except Exception:
            self.upload_errors += 1
            raise
        self.upload_seconds.observe(time.perf_counter() - started)

    async def _publish_manifests(self) -> None:
        """Publishes the manifests of the streams whose cold data changed (of every stream, once a term)."""
        now = self.node.now_ms()
        streams = self.machine.streams
        everything, self._publish_all = self._publish_all, False
        changed = self.machine.upkeep.take_manifests() | self._republish
        self._republish = set()
        todo: Iterable[int] = list(streams) if everything else sorted(changed)
        try:
            while self._to_empty:  # first: a stream of the same name publishes over it below
                emptied, (bucket, stream) = next(iter(self._to_empty.items()))
                empty = seg.Manifest(bucket, stream, DEFAULT_CONTENT_TYPE).to_json()
                try:
                    # Only while it waits for the collector: once collected, or taken back by a stream of
                    # the name that sealed a segment of its own, it is not the dropped stream's any more.
                    if self.machine.queued_for_deletion(emptied):
                        await blocking.run("tiering", self.store.put, emptied, empty)
                except Exception as exc:
                    if stops_a_pass(exc):
                        raise
                    log.warning("emptying %.300r failed (the collector deletes it later): %s", emptied, exc)
                del self._to_empty[emptied]
            for n, sid in enumerate(todo, 1):
                if n % YIELD_EVERY == 0:
                    await asyncio.sleep(0)  # a pass over every stream lets requests through
                meta = streams.get(sid)
                if meta is None or meta.tiered <= meta.fork_pos:
                    continue
                name, version = (meta.bucket, meta.name), self._version(meta)
                published = self._published.get(name)
                if published and published[0] == version:
                    continue
                if self.failing.ready(sid, now):
                    await self._isolated(meta, self._publish)
                if self._published.get(name, ((),))[0] != version:
                    self._republish.add(sid)  # set aside, or failed: tried again once its backoff allows
        except BaseException:
            self._publish_all = everything
            self._republish.update(changed)  # the pass stopped (an outage): what it did not reach waits
            raise

    @staticmethod
    def _version(meta: StreamMeta) -> tuple[int, int, int]:
        return meta.sid, meta.tiered, meta.earliest

    async def _publish(self, meta: StreamMeta) -> None:
        """Writes the stream's manifest; a stream whose records are all in packs has none (the packs'
        indexes list it), so small streams cost no object of their own."""
        version, directory = self._version(meta), self._manifest_dir(meta)
        manifest = self._manifest(meta, directory)
        key = f"{directory}/manifest.json"
        # All in packs: the indexes list it, unless a manifest of an earlier stream of the name is still
        # there (queued for deletion), which catalog readers would take over the indexes.
        own = any(not entry.path.startswith("../") for entry in manifest.segments)
        if own or self.machine.queued_for_deletion(key):
            await blocking.run("tiering", self.store.put, key, manifest.to_json())
            self._published_at[key] = (meta.bucket, meta.name)
        self._published[(meta.bucket, meta.name)] = (version, key)

    def _manifest_dir(self, meta: StreamMeta) -> str:
        """The directory of the stream's own segments: its manifest goes beside them."""
        own = (s for s in self.machine.segments(meta.sid, meta.fork_pos, meta.tiered) if not s.packed)
        first = next(own, None)
        return keys.dir_of(first.key) if first is not None else self._dir(meta)

    def _manifest(self, meta: StreamMeta, directory: str) -> seg.Manifest:
        prefix = directory + "/"
        entries = [
            seg.SegmentEntry(
                path=posixpath.relpath(s.key, directory) if s.packed else s.key.removeprefix(prefix),
                first_offset=format_offset(s.lo),
                next_offset=format_offset(s.hi),
                records=s.records,
                bytes=s.size,
                sha256=s.sha256,
                min_append_time=s.min_time,
                max_append_time=s.max_time,
                group=s.group,
                row=s.row,
                digest=s.digest,
            )
            for s in self.machine.segments(meta.sid, meta.fork_pos, meta.tiered)
        ]
        return seg.Manifest(meta.bucket, meta.name, meta.content_type, entries)

    async def _evict(self) -> None:
        """Drops local copies of tiered records, oldest streams first, until under the disk budget."""
        excess = self.machine.local_bytes - self.config.local_disk_budget
        if excess <= 0:
            return
        metas = map(self.machine.streams.get, self.machine.upkeep.evictable)
        candidates = [m for m in metas if m is not None and m.evicted < m.tiered]
        candidates.sort(key=lambda m: (m.touched_at, m.sid))
        for meta in candidates:
            if excess <= 0:
                return
            freed = meta.tiered - meta.evicted
            outcome = await self.node.submit(Evict(meta.sid, meta.tiered))
            if outcome.code is Code.OK:
                excess -= freed

    async def _collect(self) -> None:
        """Deletes queued objects that nothing references any more, then takes them off the queue.

        A key the store refuses to delete stays queued, retried on its own backoff; the others go on.
        """
        now = self.node.now_ms()
        self.deletions.keep_only(self.machine.queued_for_deletion)
        floor = self.backup_floor()
        # A pass looks at GC_SCAN queued keys from where the last one stopped: keys a backup still
        # holds back may queue up, and each pass must not read them all again.
        looked = list(itertools.islice(self.machine.deletion_entries(self._gc_from), GC_SCAN))
        self._gc_from = looked[-1][0] + "\0" if len(looked) == GC_SCAN else ""
        queued = (key for key, released in looked if floor is None or released <= floor)
        batch = list(itertools.islice((key for key in queued if self.deletions.ready(key, now)), 1000))
        done = []
        for key in batch:
            if not self._referenced(key):
                try:
                    await blocking.run("tiering", self.store.delete, key)
                except KeyRejected as exc:
                    failure = self.deletions.failed(key, self.node.now_ms(), str(exc), object=key)
                    log.warning("deleting %.300r failed (attempt %d): %s", key, failure.attempts, exc)
                    continue
                self.deletions.succeeded(key)
                self._forget_published(key)
            done.append(key)
        if done:
            await self.node.submit(ForgetObjects(done))

    def _forget_published(self, key: str) -> None:
        """An object was deleted: if it was a manifest this leader published, it is written again
        should its name's stream still need one."""
        name = self._published_at.pop(key, None)
        published = self._published.get(name) if name is not None else None
        if name is not None and published is not None and published[1] == key:
            del self._published[name]
            self._republish.add(published[0][0])
            sid = self.machine.names.get(name)
            if sid is not None:
                self._republish.add(sid)

    def _owner(self, bucket: str, component: str) -> StreamMeta | None:
        """The stream now holding the name whose objects live in `{bucket}/{component}/`."""
        name = keys.name_of(component)
        if name is not None:
            return self.machine.lookup(bucket, name)
        sid = self._hashed_names().get((bucket, component))
        return None if sid is None else self.machine.streams.get(sid)

    def _hashed_names(self) -> dict[tuple[str, str], int]:
        """The hashed directories' owners as the applied state has them now."""
        self._follow_state()
        if self._hashed is None:  # once a term (or after a reload), and only once a hashed key is queued
            self._hashed = {
                (b, keys.stream_component(n)): sid for (b, n), sid in self.machine.names.items() if _long(n)
            }
        return self._hashed

    def _follow_state(self) -> None:
        """Brings what the worker keeps up to the applied state, every pass (so what piles up meanwhile
        is one pass's worth): a reloaded state machine (a checkpoint installed) has new sets, and the
        worker starts over as in a new term; else the owners of hashed directories follow the streams
        created and dropped since the last call."""
        upkeep = self.machine.upkeep
        added, removed = upkeep.take_names()
        if upkeep is not self._upkeep:
            self._upkeep = upkeep
            self._look_again()
        for sid, bucket, name in removed:
            published = self._published.get((bucket, name))
            if published is not None and published[0][0] == sid:
                del self._published[(bucket, name)]
                if published[1] in self._published_at:  # written (a stream all in packs has none)
                    self._to_empty[published[1]] = (bucket, name)
        hashed = self._hashed
        if hashed is None:
            return
        for sid, bucket, name in removed:
            if _long(name) and hashed.get(place := (bucket, keys.stream_component(name))) == sid:
                del hashed[place]
        streams = self.machine.streams
        for sid in added:
            meta = streams.get(sid)
            if meta is not None and _long(meta.name):
                hashed[(meta.bucket, keys.stream_component(meta.name))] = sid

    def _look_again(self) -> None:
        """What a new term, or a reloaded state, starts with: every manifest, pack index and retention
        looked at once, and the owners of hashed directories built again if they are needed."""
        upkeep = self.machine.upkeep
        upkeep.take_manifests()
        upkeep.take_retention()
        upkeep.take_names()
        self._publish_all, self._hashed = True, None
        self._to_empty.clear()  # the queue of deletions says what is still to empty; a new term empties none
        self.retention.forget()
        self.packer.forget()

    def _referenced(self, key: str) -> bool:
        if key in self.node.uploading:
            return True
        if is_pack(key):
            return self.packer.referenced(key)
        parts = keys.split_dir(keys.dir_of(key))
        meta = None if parts is None else self._owner(*parts)
        if meta is None:
            return False
        if "/snapshots/" in key:
            return key in self.machine.snapshot_keys(meta.sid)
        parsed = keys.parse(key)
        if parsed is None:
            return False
        if parsed[2] is None:  # the manifest: needed while the stream has segments of its own beside it
            own = next((s for s in self.machine.segments(meta.sid, meta.fork_pos, meta.tiered) if not s.packed), None)
            return own is not None and f"{keys.dir_of(own.key)}/manifest.json" == key
        segment = self.machine.segment_at(meta.sid, parsed[2])
        return segment is not None and segment.key == key


def _long(name: str) -> bool:
    """Whether a name may be hashed: percent-encoding at most triples its bytes, so shorter ones never are."""
    return 3 * len(name.encode()) > keys.MAX_COMPONENT_BYTES
