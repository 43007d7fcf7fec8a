"""Rules of the cold tier: recording uploaded segments and packs, merging segments, evicting their
local copy, and the queue of objects to delete from the object store.

The tiering worker proposes TierSegment, TierPack, MergeSegments and Evict; a retried or superseded
proposal finds the stream moved on and is answered STALE, so applying it twice changes nothing.

A pack (many streams' slices in one object) is referenced by each slice a stream holds; PACKS counts
them, and the pack and its index are queued for deletion when the last one is released.
"""

from __future__ import annotations

import msgspec

from app.state_machine import records as r
from app.state_machine.commands import Code, Evict, ForgetObjects, MergeSegments, Outcome, TierPack, TierSegment
from app.state_machine.reader import is_boundary, segment_at, segments
from app.state_machine.table import StreamTable

PACKS_DIRECTORY = "!packs"  # `{bucket}/!packs/`: percent-encoded stream names never contain `!`


def manifest_of(segment_key: str) -> str:
    """The manifest beside a segment: `{dir}/segments/{range}.parquet` -> `{dir}/manifest.json`."""
    return segment_key.rsplit("/segments/", 1)[0] + "/manifest.json"


def is_pack(key: str) -> bool:
    """Whether `key` is a pack or a pack's index: `{bucket}/!packs/{name}`."""
    parts = key.split("/")
    return len(parts) == 3 and parts[1] == PACKS_DIRECTORY


def pack_index_of(key: str) -> str:
    """The index published beside a pack: `{name}.parquet` -> `{name}.json`."""
    return key.removesuffix(".parquet") + ".json"


def pack_of_index(key: str) -> str:
    """The pack an index describes: `{name}.json` -> `{name}.parquet` (a pack's own key is kept)."""
    return key.removesuffix(".json") + ".parquet" if key.endswith(".json") else key


def tier_segment(table: StreamTable, cmd: TierSegment, now: int) -> Outcome:
    meta, segment = table.streams.get(cmd.sid), cmd.segment
    # Stale if the stream is gone or tiering moved on (a retried or superseded proposal).
    if meta is None or segment.lo != meta.tiered or not segment.lo < segment.hi <= meta.tail:
        return _stale_upload(table, segment)
    if not segment.starts or not is_boundary(table, meta, segment.hi):
        return _stale_upload(table, segment)
    table.stage(r.SEGMENTS, r.data_key(meta.sid, segment.lo), r.encode(segment))
    # The same key may have been queued for deletion by an earlier stream of the same name.
    if not segment.packed:
        for key in (segment.key, manifest_of(segment.key)):
            dequeue_object(table, key)
    meta.tiered = segment.hi
    table.untiered_bytes -= segment.hi - segment.lo
    table.dirty.add(meta.sid)
    return Outcome(Code.OK, sid=meta.sid, next_pos=segment.hi)


def _stale_upload(table: StreamTable, segment: r.SegmentInfo) -> Outcome:
    """A segment uploaded for nothing (the stream moved on meanwhile) is queued for deletion; the
    collector keeps it if an earlier entry recorded the same object. A pack's slice counts in its pack."""
    if not segment.packed and "/segments/" in segment.key:
        enqueue_object(table, segment.key)
    return Outcome(Code.STALE)


def tier_pack(table: StreamTable, cmd: TierPack, now: int) -> Outcome:
    """Takes each slice whose stream is still where it was; the pack counts those. A pack with none
    (every stream moved on: a retry of a pack already recorded, say) is queued for deletion unless
    an earlier entry recorded the same object."""
    if not is_pack(cmd.key) or not cmd.key.startswith(cmd.bucket + "/"):
        return Outcome(Code.STALE)
    taken = 0
    for sid, given in cmd.slices:
        meta = table.streams.get(sid)
        if not given.packed or meta is None or meta.bucket != cmd.bucket:
            continue
        segment = msgspec.structs.replace(given, key=cmd.key, size=cmd.size, sha256=cmd.sha256)
        if tier_segment(table, TierSegment(sid, segment), now).code is Code.OK:
            table.stage(r.PACKED, r.packed_key(cmd.key, sid, segment.lo), b"")
            taken += 1
    raw = table.get(r.PACKS, cmd.key.encode())
    info = r.decode_pack(raw) if raw is not None else r.PackInfo(cmd.bucket, cmd.size, cmd.sha256, 0, 0)
    info.live += taken
    info.slices += taken
    table.stage(r.PACKS, cmd.key.encode(), r.encode(info))
    for key in (cmd.key, pack_index_of(cmd.key)):
        (dequeue_object if info.live > 0 else enqueue_object)(table, key)
    return Outcome(Code.OK, next_pos=taken)


def merge_segments(table: StreamTable, cmd: MergeSegments, now: int) -> Outcome:
    meta, merged = table.streams.get(cmd.sid), cmd.segment
    if meta is None or merged.packed or not meta.fork_pos <= merged.lo < merged.hi <= meta.tiered:
        return _stale_upload(table, merged)
    old = list(segments(table, meta.sid, merged.lo, merged.hi))
    if len(old) < 2 or old[0].lo != merged.lo or old[-1].hi != merged.hi:
        return _stale_upload(table, merged)
    if b"".join(r.encode_starts(merged.lo, s.record_starts()) for s in old) != merged.starts:
        return _stale_upload(table, merged)  # not the same records: the segments changed since it was built
    for segment in old:
        table.unstage(r.SEGMENTS, r.data_key(meta.sid, segment.lo))
        release_segment(table, meta.sid, segment)
    table.stage(r.SEGMENTS, r.data_key(meta.sid, merged.lo), r.encode(merged))
    for key in (merged.key, manifest_of(merged.key)):
        dequeue_object(table, key)
    table.dirty.add(meta.sid)
    return Outcome(Code.OK, sid=meta.sid, next_pos=merged.hi)


def evict(table: StreamTable, cmd: Evict, now: int) -> Outcome:
    meta = table.streams.get(cmd.sid)
    if meta is None or not meta.evicted < cmd.upto <= meta.tiered:
        return Outcome(Code.STALE)
    segment = segment_at(table, meta.sid, cmd.upto - 1)
    if segment is None or segment.hi != cmd.upto:
        return Outcome(Code.STALE)
    table.batch.delete_range(r.DATA, r.data_key(meta.sid, meta.evicted), r.data_key(meta.sid, cmd.upto))
    table.local_bytes -= cmd.upto - meta.evicted
    meta.evicted = cmd.upto
    table.dirty.add(meta.sid)
    return Outcome(Code.OK, sid=meta.sid, next_pos=cmd.upto)


def forget_objects(table: StreamTable, cmd: ForgetObjects, now: int) -> Outcome:
    for key in cmd.keys:
        dequeue_object(table, key)
        raw = table.get(r.PACKS, key.encode()) if is_pack(key) else None
        if raw is not None and r.decode_pack(raw).live <= 0:
            table.unstage(r.PACKS, key.encode())
    return Outcome(Code.OK)


def release_segment(table: StreamTable, sid: int, segment: r.SegmentInfo, manifest: bool = False) -> None:
    """A segment no stream holds any more: its object (and with `manifest`, the manifest beside it) is
    queued for deletion; a pack slice only counts down its pack."""
    if not segment.packed:
        enqueue_object(table, segment.key)
        if manifest:
            enqueue_object(table, manifest_of(segment.key))
        return
    raw = table.get(r.PACKS, segment.key.encode())
    table.unstage(r.PACKED, r.packed_key(segment.key, sid, segment.lo))
    if raw is None:
        return
    info = r.decode_pack(raw)
    info.live -= 1
    table.stage(r.PACKS, segment.key.encode(), r.encode(info))
    if info.live <= 0:
        enqueue_object(table, segment.key)
        enqueue_object(table, pack_index_of(segment.key))


def enqueue_object(table: StreamTable, key: str) -> None:
    """Queues an object for deletion, noting the entry that released it: a state backup taken
    before that entry may still name the object (app/tiering/worker.py keeps it while one is kept)."""
    raw = key.encode()
    if table.get(r.GC_QUEUE, raw) is None:
        table.queued_objects += 1
    table.stage(r.GC_QUEUE, raw, r.U64.pack(table.index))


def dequeue_object(table: StreamTable, key: str) -> None:
    raw = key.encode()
    if table.get(r.GC_QUEUE, raw) is not None:
        table.queued_objects -= 1
        table.unstage(r.GC_QUEUE, raw)
