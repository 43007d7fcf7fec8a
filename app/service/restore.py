"""`rill restore`: a node's data directory rebuilt from the object store when every node's disk is lost.

The newest state backup (or the newest at or before an index or a time) gives the state: buckets,
streams, their configuration, producers, subscriptions and acknowledged offsets, the segments tiered
until then, and the records not yet sealed when it was taken. Each stream's manifest and its
bucket's pack indexes (app/tiering/catalog.py) then bring back the segments and pack slices sealed
after the backup: their records are the stream's again, and the producer that appended each one is
remembered, so a producer's retry of such an append is still deduplicated. A stream created after
the backup comes back from the object store alone: its sealed records, content type and producers,
not what only the lost state knew (a TTL, closure, attributes).

The node starts as a new one-node cluster (the backup's membership is dropped; its Raft log begins
right after the newest backup's index in the store, so that the new history's backups come after
any of an abandoned one's); others join it with `rill cluster add`. Acknowledged appends that
were neither in the backup nor in a segment sealed after it are lost; `Restored.recovery_point` is the
time before which nothing acknowledged is.
"""

from __future__ import annotations

import io
import shutil
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq

from app.cluster.log_store import COLUMN_FAMILIES as LOG_COLUMN_FAMILIES
from app.cluster.log_store import LogStore
from app.domain.media import JSON, media_type
from app.domain.names import BUCKET_ID
from app.domain.offsets import format_offset
from app.raft.messages import HardState
from app.state_machine import backup
from app.state_machine import records as r
from app.state_machine.cold_tier import pack_index_of
from app.state_machine.export import Pair, load
from app.state_machine.table import BUILTIN_BUCKETS
from app.storage.kv import KV, Batch
from app.storage.rocks import RocksKV
from app.storage.state_store import StateStore
from app.tiering import catalog
from app.tiering import pack as packs
from app.tiering import segment as seg
from app.tiering.store import ObjectStore, sha256_hex


class RestoreError(Exception):
    """Nothing to restore from, or a data directory that is not empty: nothing was written."""


@dataclass
class Restored:
    key: str
    index: int
    term: int
    created_at: int  # ms: when the backup was taken
    streams: int
    segments_after: int = 0  # segments and pack slices sealed after the backup, brought back
    records_after: int = 0
    bytes_after: int = 0
    last_sealed_at: int = 0  # ms: the newest record brought back (0: none after the backup)
    new_streams: int = 0  # created after the backup, brought back from the object store
    unknown_streams: list[str] = field(default_factory=list)  # streams that could not be brought back
    skipped: list[str] = field(default_factory=list)  # objects of the store that are not what they should be
    newer_backups: int = 0  # later backups in the store: the collector keeps only the newest one's objects

    @property
    def recovery_point(self) -> int:
        """ms: every append acknowledged before this is restored (it is in the backup, or in a segment
        the backup names). Later ones are restored where a segment sealed after the backup holds them."""
        return self.created_at


def backups(store: ObjectStore) -> list[tuple[int, str, str]]:
    """(index, key, sha256) of every state backup in the store, oldest first."""
    found = []
    for key in store.list(backup.KEY_PREFIX):
        parsed = backup.parse_key(key)
        if parsed is not None:
            found.append((parsed[0], key, parsed[1]))
    return sorted(found)


def choose(store: ObjectStore, at_index: int | None = None, at_time: int | None = None) -> tuple[str, bytes]:
    """The key and bytes of the newest backup at or before `at_index` and `at_time` (ms)."""
    for index, key, digest in reversed(backups(store)):
        if at_index is not None and index > at_index:
            continue
        try:
            data = store.get(key)
        except KeyError:
            continue  # pruned since it was listed (a node still writing backups): an older one will do
        if at_time is not None:
            try:
                if backup.read_header(data).created_at > at_time:
                    continue  # later than asked for: whether the rest of it is sound does not matter
            except backup.BackupError:
                pass  # its time cannot be read: the full check below says what is wrong with it
        try:
            header, _ = backup.decode(data, digest)
        except backup.BackupError as exc:
            raise backup.BackupError(f"{key}: {exc} (restore an older backup with --at INDEX)") from None
        if header.index != index:
            raise backup.BackupError(f"{key} holds the state at index {header.index}, not the one its key names")
        if at_time is not None and header.created_at > at_time:
            continue
        return key, data
    wanted = "" if at_index is None and at_time is None else " at or before the point asked for"
    raise RestoreError(f"the object store holds no state backup{wanted} under {backup.KEY_PREFIX}")


def restore(store: ObjectStore, data_dir: Path, at_index: int | None = None, at_time: int | None = None) -> Restored:
    """Builds `data_dir` (which must not hold a node already) from the store."""
    # A store half swapped in (`state.old`, `state.staging`) would be opened under the backup's frames.
    for part in ("state", "raft", "state.old", "state.staging"):
        if (data_dir / part).exists():
            raise RestoreError(f"{data_dir / part} exists: restore into an empty data directory")
    key, data = choose(store, at_index, at_time)
    header, frames = backup.decode(data)
    # The new history's log starts past every backup in the store: restored to an earlier point, its
    # own backups must be the newest (by index) there, not the abandoned history's later ones, which
    # pruning, the collector's floor and a later restore would otherwise take for its own.
    indexes = [index for index, _, _ in backups(store)]
    start = max([header.index, *indexes])
    data_dir.mkdir(parents=True, exist_ok=True)
    try:
        done = _restore_state(store, data_dir, key, header, frames, start)
        done.newer_backups = sum(1 for index in indexes if index > header.index)
        log = RocksKV(data_dir / "raft", LOG_COLUMN_FAMILIES)
        try:
            # The log starts after the backup, as on a follower that installed it as a checkpoint.
            raft_log = LogStore(log)
            raft_log.restore(start, header.term)
            raft_log.save(HardState(term=header.term, vote=0, commit=start), [])
        finally:
            log.close()
    except BaseException:
        for part in ("state", "raft"):  # nothing half-written: the directory stays ready for a retry
            shutil.rmtree(data_dir / part, ignore_errors=True)
        raise
    return done


def _restore_state(
    store: ObjectStore, data_dir: Path, key: str, header: backup.Header, frames: Iterator[list[Pair]], start: int
) -> Restored:
    state = StateStore(data_dir, r.COLUMN_FAMILIES).open()
    try:
        for frame in frames:
            load(state, frame)
        metas = _streams(state)
        done = Restored(key, header.index, header.term, header.created_at, len(metas))
        _start_a_new_cluster(state, start, header.term)
        found = catalog.read(store, catalog.listing(store), done.skipped)
        objects = _Objects(store)
        packs_in_backup = {key.decode() for key, _ in state.scan(r.PACKS, b"")}
        for meta in metas:
            _evict_what_was_left_out(state, meta)
            if not meta.deleted:
                _bring_back_sealed(objects, state, meta, done, found.get((meta.bucket, meta.name)), start + 1)
        _bring_back_new_streams(objects, state, done, found, packs_in_backup)
        state.sync_wal()
        return done
    finally:
        state.close()


def _start_a_new_cluster(state: KV, start: int, term: int) -> None:
    """Drops the old cluster's membership (the node's own settings say who it is), and has the state
    applied up to where the new log starts."""
    batch = Batch()
    batch.delete(r.SM_META, r.MEMBERSHIP_KEY)
    batch.put(r.SM_META, r.APPLIED_KEY, r.encode_applied(start, term))
    state.write(batch)


def _evict_what_was_left_out(state: KV, meta: r.StreamMeta) -> None:
    """The backup left out the records below each stream's tiered offset: they are in segments only."""
    if meta.evicted >= meta.tiered:
        return
    meta.evicted = meta.tiered
    batch = Batch()
    batch.put(r.STREAMS, r.sid_key(meta.sid), r.encode(meta))
    state.write(batch)


def _streams(state: KV) -> list[r.StreamMeta]:
    try:
        return [r.decode_meta(value) for _, value in state.scan(r.STREAMS, b"")]
    except msgspec.MsgspecError as exc:
        raise backup.BackupError(f"the backup holds a stream this version cannot read: {exc}") from None


@dataclass
class _Sealed:
    """One segment or pack slice read back: where its records start, and each producer's last append."""

    info: r.SegmentInfo
    records: int
    producers: dict[str, r.ProducerState]


class _Objects:
    """The store's segments and packs as a restore reads them: every object checked against its size
    and SHA-256 (a pack whole, once, and against the digest its key is named by)."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store
        self._packs: OrderedDict[str, pq.ParquetFile | None] = OrderedDict()

    def pack(self, key: str, size: int, sha256: str) -> pq.ParquetFile | None:
        if key not in self._packs:
            data = self.store.get(key)
            sound = len(data) == size and sha256_hex(data) == sha256 and key.endswith(f"/{sha256[:40]}.parquet")
            self._packs[key] = pq.ParquetFile(pa.BufferReader(data)) if sound else None
            while len(self._packs) > 4:
                self._packs.popitem(last=False)
        return self._packs[key]

    def rows(self, entry: catalog.Entry) -> pa.Table | None:
        """The entry's rows, if its object is the one the catalog names."""
        if entry.packed:
            parquet = self.pack(entry.key, entry.size, entry.sha256)
            if parquet is None:
                return None
            table = packs.rows_of(parquet, entry.key, entry.group, entry.row, entry.records, _ROW_COLUMNS)
            return table if packs.slice_digest(table.column("payload").to_pylist()) == entry.digest else None
        data = self.store.get(entry.key)
        if len(data) != entry.size or sha256_hex(data) != entry.sha256:
            return None
        if seg.load(data).positions[:1] != [entry.first]:  # as the server's cold reads will load it
            return None
        return pq.read_table(io.BytesIO(data), columns=_ROW_COLUMNS)


def _read_entry(
    objects: _Objects, bucket: str, name: str, entry: catalog.Entry, known: tuple[int, int, bytes] | None = None
) -> _Sealed | None:
    """The entry's records read and checked; None when they are not what the catalog says: another
    object, another stream's rows, records that do not tile [entry.first, entry.next), or, with
    `known` (the backup's own record at a position: its time and bytes), not that record there."""
    try:
        return _checked_entry(objects, bucket, name, entry, known)
    except Exception:  # noqa: BLE001 - missing, not Parquet, columns of other types: not what the catalog says
        return None


def _checked_entry(
    objects: _Objects, bucket: str, name: str, entry: catalog.Entry, known: tuple[int, int, bytes] | None
) -> _Sealed | None:
    table = objects.rows(entry)
    if table is None or table.num_rows != entry.records:
        return None
    if set(table.column("bucket").to_pylist()) != {bucket} or set(table.column("stream").to_pylist()) != {name}:
        return None
    positions, pos = [], entry.first
    times = table.column("append_time").cast(pa.int64()).to_pylist()
    rows = zip(table.column("offset").to_pylist(), table.column("payload").to_pylist(), times, strict=True)
    for token, payload, time in rows:
        if token != format_offset(pos):
            return None
        if known is not None and pos == known[0] and (time, payload) != (known[1], known[2]):
            return None  # another stream of the name, made after the backup: not this one's records
        positions.append(pos)
        pos += len(payload)
    if pos != entry.next:
        return None
    info = r.SegmentInfo(
        entry.first, entry.next, entry.key, entry.size, entry.sha256, entry.min_append_time,
        entry.max_append_time, r.encode_starts(entry.first, positions), entry.group, entry.row, entry.digest,
    )  # fmt: skip
    return _Sealed(info, len(positions), _producers(table))


def _bring_back_sealed(
    objects: _Objects,
    state: KV,
    meta: r.StreamMeta,
    done: Restored,
    found: catalog.StreamEntries | None,
    released: int = 0,
) -> None:
    """Records the stream's segments and slices sealed after the backup, in order from its tiered offset;
    what a merge replaced is queued for deletion as released at index `released`."""
    if found is None:
        return
    by_start = {entry.first: entry for entry in found.entries}
    evicted_from = meta.evicted
    batch = Batch()
    written = meta.tiered
    # A stream deleted and made again since has entries of its own from the same offsets: they must be
    # of the backup's content type; the entry ending at (or running across) the tiered offset must hold
    # a record as old as the backup's last sealed one (a later stream's are all younger); and the chain's
    # first record must be the backup's first one not sealed then, if it holds one.
    link = next((entry for entry in found.entries if entry.first < meta.tiered <= entry.next), None)
    last = _last_sealed(state, meta)
    newest = last.max_time if last is not None else done.created_at
    if found.content_type != meta.content_type or (link is not None and link.min_append_time > newest):
        done.skipped.append(f"{meta.bucket}/{meta.name}: its segments are another stream's of the name, made later")
        return
    known = _local_record(state, meta)
    while (entry := by_start.get(meta.tiered)) is not None or (entry := _merged_across(state, meta, found)):
        sealed = _read_entry(objects, meta.bucket, meta.name, entry, known)
        known = None
        if sealed is None:
            break  # not the object the catalog names, or another stream's: stop at what is certain
        if entry.first < meta.tiered:  # it replaces the backup's segments from its start
            _drop_merged(state, batch, meta, entry.first, released)
        lo, hi = meta.tiered, entry.next
        batch.put(r.SEGMENTS, r.data_key(meta.sid, entry.first), r.encode(sealed.info))
        if entry.packed:
            _count_slice(state, batch, meta, sealed.info)
        for producer_id, after in sealed.producers.items():
            key = r.producer_key(meta.sid, producer_id)
            held = state.get(r.PRODUCERS, key)
            if held is None or r.decode_producer(held).next_pos < after.next_pos:  # only what is newer
                batch.put(r.PRODUCERS, key, r.encode(after))
        meta.tiered = meta.evicted = hi
        meta.tail = max(meta.tail, hi)
        meta.touched_at = max(meta.touched_at, entry.max_append_time)  # its TTL counts from its last append
        done.segments_after += 1
        done.records_after += sum(1 for start in sealed.info.record_starts() if start >= lo)  # not a merge's older ones
        done.bytes_after += hi - lo
        done.last_sealed_at = max(done.last_sealed_at, entry.max_append_time)
    if meta.tiered == written:
        return
    # The backup's local copies of what is now sealed are not needed: reads go to the segments.
    batch.delete_range(r.DATA, r.data_key(meta.sid, evicted_from), r.data_key(meta.sid, meta.evicted))
    batch.put(r.STREAMS, r.sid_key(meta.sid), r.encode(meta))
    state.write(batch)


def _last_sealed(state: KV, meta: r.StreamMeta) -> r.SegmentInfo | None:
    """The backup's segment ending at the stream's tiered offset, if it has one."""
    found = state.floor(r.SEGMENTS, r.data_key(meta.sid, meta.tiered - 1)) if meta.tiered > 0 else None
    if found is None or not found[0].startswith(r.sid_key(meta.sid)):
        return None
    segment = r.decode_segment(found[1])
    return segment if segment.hi == meta.tiered else None


def _local_record(state: KV, meta: r.StreamMeta) -> tuple[int, int, bytes] | None:
    """(position, append time, bytes) of the backup's record at its tiered offset, if it holds one."""
    if meta.tail <= meta.tiered:
        return None
    raw = state.get(r.DATA, r.data_key(meta.sid, meta.tiered))
    return None if raw is None else (meta.tiered, r.record_time(raw), bytes(r.record_payload(raw)))


def _merged_across(state: KV, meta: r.StreamMeta, found: catalog.StreamEntries) -> catalog.Entry | None:
    """A segment merged after the backup from some of the segments it records and later ones: it
    starts before the backup's tiered offset and ends past it, and the backup's segments tile
    [its start, tiered offset) exactly. None if there is none (the chain ends there)."""
    for entry in found.entries:
        if not meta.fork_pos <= entry.first < meta.tiered < entry.next:
            continue
        pos = entry.first
        for _, raw in state.scan(r.SEGMENTS, r.data_key(meta.sid, entry.first), r.data_key(meta.sid, meta.tiered)):
            segment = r.decode_segment(raw)
            if segment.lo != pos:
                break
            pos = segment.hi
        else:
            if pos == meta.tiered and pos > entry.first:
                return entry
    return None


def _drop_merged(state: KV, batch: Batch, meta: r.StreamMeta, first: int, released: int) -> None:
    """Drops the backup's records of the segments a merge replaced, from `first` to its tiered offset,
    and queues what nothing holds any more for deletion, as released at index `released`: the
    collector keeps it until the restored cluster's first backup (a pack slice counts down its pack)."""
    start, end = r.data_key(meta.sid, first), r.data_key(meta.sid, meta.tiered)
    when = r.U64.pack(released)
    for _, raw in state.scan(r.SEGMENTS, start, end):
        segment = r.decode_segment(raw)
        if not segment.packed:
            batch.put(r.GC_QUEUE, segment.key.encode(), when)
            continue
        key = segment.key.encode()
        pack = state.get(r.PACKS, key)
        if pack is not None:
            info = r.decode_pack(pack)
            info.live -= 1
            batch.put(r.PACKS, key, r.encode(info))
            if info.live <= 0:
                batch.put(r.GC_QUEUE, key, when)
                batch.put(r.GC_QUEUE, pack_index_of(segment.key).encode(), when)
        batch.delete(r.PACKED, r.packed_key(segment.key, meta.sid, segment.lo))
    batch.delete_range(r.SEGMENTS, start, end)


def _count_slice(state: KV, batch: Batch, meta: r.StreamMeta, info: r.SegmentInfo) -> None:
    """The pack holds one more live slice (a pack written after the backup is recorded here first)."""
    key = info.key.encode()
    raw = state.get(r.PACKS, key)  # a stream has one slice per pack: the batch puts none here yet
    pack = r.decode_pack(raw) if raw else r.PackInfo(meta.bucket, info.size, info.sha256, 0, 0)
    pack.live += 1
    pack.slices += 1
    batch.put(r.PACKS, key, r.encode(pack))
    batch.put(r.PACKED, r.packed_key(info.key, meta.sid, info.lo), b"")


_ROW_COLUMNS = [
    "bucket", "stream", "offset", "next_offset", "append_time", "producer_id", "producer_epoch", "producer_seq",
    "payload",
]  # fmt: skip


def _producers(table: pa.Table) -> dict[str, r.ProducerState]:
    """Each producer's last append among the rows: its epoch, seq and the tail after it."""
    last: dict[str, r.ProducerState] = {}
    columns = [
        table.column(name).to_pylist() for name in ("next_offset", "producer_id", "producer_epoch", "producer_seq")
    ]
    for next_offset, producer_id, epoch, seq in zip(*columns, strict=True):
        if producer_id is not None:
            last[producer_id] = r.ProducerState(epoch, seq, seg.offset_of(next_offset))
    return last


def _bring_back_new_streams(
    objects: _Objects,
    state: KV,
    done: Restored,
    found: dict[tuple[str, str], catalog.StreamEntries],
    packs_known: set[str],
) -> None:
    """Streams created after the backup, from the object store: their sealed records, content type and
    producers come back; what only the lost state knew (TTL, closure, attributes) does not. A stream
    that starts inside another's (a fork) cannot be, and is listed in `done.unknown_streams`.

    A stream the backup does not know was created after it, unless its objects say it was deleted
    before: a segment queued for deletion, or a slice of a pack the backup knows (every slice of a
    pack is recorded at once, so a stream missing from such a pack had been deleted), or a manifest
    queued for deletion. Its first entry must read back before the stream is created."""
    known = {(meta.bucket, meta.name) for meta in _streams(state)}
    queued = {key.decode() for key, _ in state.scan(r.GC_QUEUE, b"")}
    raw = state.get(r.SM_META, r.NEXT_SID_KEY)
    if raw is not None and len(raw) != r.U64.size:
        raise RestoreError("the state backup's next stream id is not a 64-bit number: the backup is damaged")
    next_sid = r.U64.unpack(raw)[0] if raw else 1
    buckets = {key.decode() for key, _ in state.scan(r.BUCKETS, b"")} | set(BUILTIN_BUCKETS)
    for (bucket, name), entries in sorted(found.items()):
        live = [e for e in entries.entries if e.key not in queued and not (e.packed and e.key in packs_known)]
        if (bucket, name) in known or not live or len(live) != len(entries.entries) or entries.manifest in queued:
            continue
        usable = bucket in buckets or BUCKET_ID.fullmatch(bucket)
        if not usable or live[0].first != 0 or _read_entry(objects, bucket, name, live[0]) is None:
            done.unknown_streams.append(f"{bucket[:100]}/{name[:200]}")
            continue
        created = min(entry.min_append_time for entry in live)
        meta = r.StreamMeta(
            next_sid, bucket, name, entries.content_type, media_type(entries.content_type) == JSON, created, created
        )
        batch = Batch()
        if bucket not in buckets:
            batch.put(r.BUCKETS, bucket.encode(), r.U64.pack(created))
            buckets.add(bucket)
        batch.put(r.NAMES, r.name_key(meta.bucket, meta.name), r.sid_key(meta.sid))
        batch.put(r.STREAMS, r.sid_key(meta.sid), r.encode(meta))
        next_sid += 1
        batch.put(r.SM_META, r.NEXT_SID_KEY, r.U64.pack(next_sid))
        state.write(batch)
        known.add((meta.bucket, meta.name))
        _bring_back_sealed(objects, state, meta, done, entries)
        done.new_streams += 1
    done.unknown_streams.sort()
