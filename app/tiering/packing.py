"""The tiering worker's part for small streams: packing their sealed records together, publishing
each pack's index, and merging a stream's small segments into one of its own.

Streams due by age with little to seal are packed per bucket (app/tiering/pack.py), up to a pack's
size or slice count, so the object count follows bytes rather than streams. A stream that keeps
trickling collects a small segment per seal; once it has `merge_min_segments` of them, the records
(still on local disk) are rewritten as one segment of its own and the small ones released.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from app.domain.offsets import format_offset
from app.runtime import blocking
from app.state_machine import records as r
from app.state_machine.cold_tier import pack_index_of, pack_of_index
from app.state_machine.commands import Code, MergeSegments, TierPack
from app.state_machine.machine import StateMachine
from app.state_machine.records import SegmentInfo, StreamMeta
from app.tiering import pack as packs
from app.tiering import segment as seg
from app.tiering.proposer import Proposer, TieringConfig
from app.tiering.store import ObjectStore, sha256_hex, stops_a_pass

log = logging.getLogger("rill.tiering")

MAX_SLICES = 5_000  # per pack: bounds the TierPack entry (about 100 bytes a slice)


@dataclass
class Built:
    data: memoryview
    command: TierPack | None  # None: none of the streams had anything to seal any more
    looked_at: int  # streams of the list considered (the rest wait for the next pack)


class Packer:
    def __init__(
        self,
        node: Proposer,
        store: ObjectStore,
        config: TieringConfig,
        upload: Callable[[SegmentInfo, bytes | memoryview], None],
    ) -> None:
        self.node = node
        self.machine = node.machine
        self.store = store
        self.config = config
        self.upload = upload
        self.packed = 0
        self.merged = 0
        self._indexes: dict[str, int] = {}  # pack key -> live slices its published index lists
        self._small: dict[int, int] = {}  # sid -> small segments sealed since its last merge (this term)
        self._merge_due: set[int] = set()  # sids in _small with merge_min_segments or more
        self._index_all = True  # a new term looks at every pack's index once
        self._reindex: set[str] = set()  # packs a stopped pass did not reach

    def forget(self) -> None:
        """Leadership was lost: a later term republishes every index."""
        self._indexes.clear()
        self._small.clear()
        self._merge_due.clear()
        self._index_all = True
        self.machine.upkeep.take_packs()  # the next term looks at them all anyway

    def takes(self, meta: StreamMeta) -> bool:
        """Whether a stream due now goes into a pack: it has little to seal."""
        return 0 < meta.tail - meta.tiered < self.config.pack_below_bytes

    async def tier(self, bucket: str, metas: list[StreamMeta]) -> list[StreamMeta]:
        """Packs the streams of one bucket, as many packs as they need; returns the ones taken."""
        taken: list[StreamMeta] = []
        start = 0
        while start < len(metas):
            done, looked_at = await self._tier_one(bucket, metas[start : start + MAX_SLICES])
            taken += done
            start += max(1, looked_at)
        return taken

    async def _tier_one(self, bucket: str, metas: list[StreamMeta]) -> tuple[list[StreamMeta], int]:
        """One pack from the first of `metas`; returns the streams taken and how many were looked at."""
        built = await blocking.run("tiering", self._build, bucket, metas)
        if built.command is None:
            return [], built.looked_at
        command, looked_at = built.command, built.looked_at
        info = SegmentInfo(0, 0, command.key, command.size, command.sha256, 0, 0, b"")
        await blocking.run("tiering", self.upload, info, built.data)
        del built
        seg.release_memory()
        outcome = await self.node.submit(command)
        if outcome.code is not Code.OK or outcome.next_pos == 0:
            log.info("pack %r was not recorded (%s)", command.key, outcome.code.value)
            return [], looked_at
        self.packed += 1
        taken = [self.machine.streams[sid] for sid, _ in command.slices if sid in self.machine.streams]
        for meta in taken:
            self._count_small(meta.sid)
        return taken, looked_at

    def _build(self, bucket: str, metas: list[StreamMeta]) -> Built:
        """A pack of what the first streams have to seal now, up to a segment's bytes and records (a
        stream that moved on meanwhile is left out; one that grew gives at most `pack_below_bytes`)."""
        slices: list[packs.Slice] = []
        ranges: list[tuple[StreamMeta, list[seg.Record]]] = []
        size = count = looked_at = 0
        for meta in metas:
            records = _records(self.machine, meta.sid, meta.tiered, meta.tail, self.config.pack_below_bytes)
            more = sum(len(rec.payload) for rec in records)
            full = size + more > self.config.segment_max_bytes or count + len(records) > self.config.segment_max_records
            if slices and full:
                break
            looked_at += 1
            if records:
                slices.append(packs.Slice(meta.name, meta.content_type, records))
                ranges.append((meta, records))
                size, count = size + more, count + len(records)
        if not slices:
            return Built(memoryview(b""), None, looked_at)
        data, placements = packs.build(bucket, slices)
        digest = sha256_hex(data)
        key = packs.pack_key(bucket, digest)
        entries = []
        for (meta, records), place in zip(ranges, placements, strict=True):
            lo, hi = records[0].pos, records[-1].pos + len(records[-1].payload)
            times = [rec.time for rec in records]
            starts = r.encode_starts(lo, [rec.pos for rec in records])
            digest_of = packs.slice_digest([rec.payload for rec in records])
            # Key, size and digest of the pack are the command's: apply fills them in for every slice.
            info = SegmentInfo(lo, hi, "", 0, "", min(times), max(times), starts, place.group, place.row, digest_of)
            entries.append((meta.sid, info))
        return Built(data, TierPack(bucket, key, len(data), digest, entries), looked_at)

    async def publish_indexes(self) -> None:
        """Writes the index of each pack whose live slices changed since its last one (of every pack,
        once a term)."""
        everything, self._index_all = self._index_all, False
        changed = self.machine.upkeep.take_packs() | self._reindex
        self._reindex = set()
        try:
            for key in [key for key, _ in self.machine.packs()] if everything else sorted(changed):
                info = self.machine.pack(key)
                if info is None:  # deleted, index and all
                    self._indexes.pop(key, None)
                    continue
                if self._indexes.get(key) == max(info.live, 0):
                    continue
                # With no live slice left it is written once with none: until the collector deletes it
                # (after the next backup), catalog readers would take its slices for live streams'.
                index = await blocking.run("tiering", self._index, key, info)
                await blocking.run("tiering", self.store.put, pack_index_of(key), index.to_json())
                self._indexes[key] = max(info.live, 0)
        except BaseException:
            self._index_all = everything
            self._reindex.update(changed)  # the pass stopped (an outage): what it did not reach waits
            raise

    def _index(self, key: str, info: r.PackInfo) -> packs.PackIndex:
        index = packs.PackIndex(info.bucket, key.rsplit("/", 1)[1], info.size, info.sha256)
        for sid, lo in self.machine.pack_slices(key):
            meta, segment = self.machine.streams.get(sid), self.machine.segment_at(sid, lo)
            if meta is None or segment is None or segment.key != key:
                continue
            index.slices.append(
                packs.IndexEntry(
                    meta.name,
                    meta.content_type,
                    format_offset(segment.lo),
                    format_offset(segment.hi),
                    segment.records,
                    segment.group,
                    segment.row,
                    segment.digest,
                    segment.min_time,
                    segment.max_time,
                )  # fmt: skip
            )
        return index

    def referenced(self, key: str) -> bool:
        """Whether a pack (or its index) still holds a live slice."""
        info = self.machine.pack(pack_of_index(key))
        return info is not None and info.live > 0

    async def merge_due(self, directory_of: Callable[[StreamMeta], str], merged: Callable[[StreamMeta], None]) -> None:
        """Merges the small segments of streams that collected `merge_min_segments` of them; `merged`
        hears of each stream as soon as one of its merges is recorded (its manifest lists other
        segments now), so a pass an outage stops still republishes what it did."""
        due, self._merge_due = sorted(self._merge_due), set()
        for n, sid in enumerate(due):
            meta = self.machine.streams.get(sid)
            try:
                if meta is not None and not meta.deleted and await self._merge_one(meta, directory_of(meta)):
                    merged(meta)
                    while await self._merge_one(meta, directory_of(meta)):
                        pass
            except BaseException as exc:
                if not isinstance(exc, Exception) or stops_a_pass(exc) or meta is None:
                    self._merge_due.update(due[n:])  # the pass stopped: what it did not finish waits
                    raise
                log.warning("merging %r/%r failed, until its next small segment: %s", meta.bucket, meta.name, exc)
            self._small.pop(sid, None)

    def sealed_small(self, meta: StreamMeta, segment: SegmentInfo) -> None:
        """Notes a segment of its own sealed small (by age), for the merge count."""
        if segment.hi - segment.lo < self.config.segment_max_bytes // 2:
            self._count_small(meta.sid)

    def _count_small(self, sid: int) -> None:
        count = self._small[sid] = self._small.get(sid, 0) + 1
        if count >= self.config.merge_min_segments:
            self._merge_due.add(sid)

    async def _merge_one(self, meta: StreamMeta, directory: str) -> bool:
        run = self._run(meta)
        if run is None:
            return False
        built = await blocking.run("tiering", self._build_merged, meta, run[0], run[1], directory)
        if built is None:
            return False
        segment, data = built
        await blocking.run("tiering", self.upload, segment, data)
        del data, built
        outcome = await self.node.submit(MergeSegments(meta.sid, segment))
        if outcome.code is not Code.OK:
            log.info("merged segment %r was not recorded (%s)", segment.key, outcome.code.value)
            return False
        self.merged += 1
        return True

    def _run(self, meta: StreamMeta) -> tuple[int, int] | None:
        """The first run of two or more small segments still on local disk, up to a segment's size."""
        limit, small = self.config.segment_max_bytes, self.config.segment_max_bytes // 2
        start = max(meta.fork_pos, meta.evicted)
        run: list[SegmentInfo] = []
        for segment in self.machine.segments(meta.sid, start, meta.tiered):
            fits = segment.lo >= start and (segment.packed or segment.hi - segment.lo < small)
            if fits and (not run or segment.hi - run[0].lo <= limit):
                run.append(segment)
                continue
            if len(run) >= 2:
                break
            run = [segment] if fits else []
        return (run[0].lo, run[-1].hi) if len(run) >= 2 else None

    def _build_merged(
        self, meta: StreamMeta, lo: int, hi: int, directory: str
    ) -> tuple[SegmentInfo, memoryview] | None:
        records = _records(self.machine, meta.sid, lo, hi)
        if not records or records[-1].pos + len(records[-1].payload) != hi:
            return None
        data = seg.build_view(meta.bucket, meta.name, meta.content_type, records)
        times = [rec.time for rec in records]
        key = f"{directory}/segments/{format_offset(lo)}-{format_offset(hi)}.parquet"
        starts = r.encode_starts(lo, [rec.pos for rec in records])
        return SegmentInfo(lo, hi, key, len(data), sha256_hex(data), min(times), max(times), starts), data


def _records(machine: StateMachine, sid: int, lo: int, hi: int, max_bytes: int = 0) -> list[seg.Record]:
    """The stream's local records from `lo`: all of [lo, hi), or with `max_bytes` the first ones up to
    about that many bytes; none if they are not all there."""
    out: list[seg.Record] = []
    expected, size = lo, 0
    for pos, value in machine.stored_records(sid, lo, hi):
        if pos != expected:
            return []
        payload = r.record_payload(value)
        out.append(seg.Record(pos, r.record_time(value), payload, r.record_producer(value)))
        expected = pos + len(payload)
        size += len(payload)
        if max_bytes and size >= max_bytes:
            return out
    return out if expected == hi else []
