"""Shared by the cold-tier state machine tests: `TH`, the harness with segments built the way the
tiering worker builds them, and `DictCold`, which serves them back as the state machine's ColdSource,
so every read of an evicted range goes through a real Parquet round trip."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator

from app.raft.messages import Entry
from app.state_machine import records as r
from app.state_machine.commands import Code, Evict, MergeSegments, Outcome, TierPack, TierSegment
from app.state_machine.machine import StateMachine
from app.storage.kv import MemoryKV
from app.tiering import pack as packs
from app.tiering import segment as seg
from app.tiering.store import sha256_hex
from tests.state_machine.helpers import OCTET, B, H, dump

U32 = struct.Struct(">I")
BIG = 1 << 20


def tier_cmd(
    sid: int, lo: int, hi: int, key: str, size: int, sha: str, first: int, last: int, starts: bytes
) -> TierSegment:
    return TierSegment(sid, r.SegmentInfo(lo, hi, key, size, sha, first, last, starts))


class DictCold:
    """A ColdSource over Parquet segment objects kept in a dict, with the contract checked on every call."""

    def __init__(self, objects: dict[str, bytes]) -> None:
        self.objects = objects
        self.calls: list[tuple[str, int, int]] = []

    def records(self, segment: r.SegmentInfo, lo: int, hi: int) -> Iterator[tuple[int, memoryview]]:
        assert segment.lo <= lo < hi <= segment.hi, f"asked for [{lo}, {hi}) of segment [{segment.lo}, {segment.hi})"
        self.calls.append((segment.key, lo, hi))
        data = self.objects[segment.key]
        assert (len(data), sha256_hex(data)) == (segment.size, segment.sha256)
        if segment.packed:
            pieces = _slice(data, segment)
        else:
            loaded = seg.load(data)
            assert loaded.positions[0] == segment.lo
            pieces = list(zip(loaded.positions, loaded.payloads, strict=True))
        for pos, payload in pieces:
            if pos + len(payload) <= lo or pos >= hi:
                continue
            view = memoryview(payload)
            yield (lo, view[lo - pos :]) if pos < lo else (pos, view)


def _slice(data: bytes, segment: r.SegmentInfo) -> list[tuple[int, memoryview]]:
    """A pack slice's records, read the way the cache reads them (its rows of its row group)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    column = pq.ParquetFile(pa.BufferReader(data)).read_row_group(segment.group, columns=["payload"])["payload"]
    payloads = [memoryview(p) for p in column.slice(segment.row, segment.records).to_pylist()]
    assert packs.slice_digest(payloads) == segment.digest
    return list(zip(segment.record_starts(), payloads, strict=True))


class TH(H):
    """The harness `H`, plus segment building, eviction and cold reads."""

    def __init__(self, kv: MemoryKV | None = None, bucket: str | None = B, tail_cache_bytes: int = 0) -> None:
        # No shared tail by default: these tests are about where each byte lives in the store.
        super().__init__(kv, bucket=bucket, tail_cache_bytes=tail_cache_bytes)
        self.objects: dict[str, bytes] = {}
        self.cold = DictCold(self.objects)

    def m(self, name: str) -> r.StreamMeta:
        meta = self.meta(name)
        assert meta is not None, name
        return meta

    def own_records(self, meta: r.StreamMeta, lo: int, hi: int) -> list[seg.Record]:
        out = []
        for key, value in self.kv.scan(r.DATA, r.data_key(meta.sid, lo), r.data_key(meta.sid, hi)):
            payload = bytes(r.record_payload(value))
            out.append(seg.Record(r.data_pos(key), r.record_time(value), payload, r.record_producer(value)))
        return out

    def segment_cmd(self, name: str, hi: int | None = None, lo: int | None = None) -> TierSegment:
        """The TierSegment the worker would propose for records [lo, hi) (default: tiered .. tail)."""
        meta = self.m(name)
        lo = meta.tiered if lo is None else lo
        hi = meta.tail if hi is None else hi
        recs = self.own_records(meta, lo, hi)
        key = seg.segment_key(meta.bucket, meta.name, lo, hi)
        data = seg.build(meta.bucket, meta.name, meta.content_type, recs) if recs else b""
        self.objects[key] = data
        starts = b"".join(U32.pack(rec.pos - lo) for rec in recs)
        times = [rec.time for rec in recs] or [0]
        return tier_cmd(meta.sid, lo, hi, key, len(data), sha256_hex(data), min(times), max(times), starts)

    def pack_cmd(self, *names: str, bucket: str = B) -> TierPack:
        """The TierPack the worker would propose for each stream's records tiered .. tail, in one pack."""
        metas = [self.m(name) for name in names]
        recs = [self.own_records(meta, meta.tiered, meta.tail) for meta in metas]
        slices = [packs.Slice(m.name, m.content_type, rs) for m, rs in zip(metas, recs, strict=True)]
        data, placements = packs.build(bucket, slices)
        key = packs.pack_key(bucket, sha256_hex(data))
        self.objects[key] = bytes(data)
        given = []
        for meta, rs, place in zip(metas, recs, placements, strict=True):
            lo, hi = rs[0].pos, rs[-1].pos + len(rs[-1].payload)
            times = [rec.time for rec in rs]
            starts = r.encode_starts(lo, [rec.pos for rec in rs])
            digest = packs.slice_digest([rec.payload for rec in rs])
            info = r.SegmentInfo(lo, hi, "", 0, "", min(times), max(times), starts, place.group, place.row, digest)
            given.append((meta.sid, info))
        return TierPack(bucket, key, len(data), sha256_hex(data), given)

    def merge_cmd(self, name: str, lo: int, hi: int) -> MergeSegments:
        """The MergeSegments the worker would propose for records [lo, hi) (still on local disk)."""
        tiered = self.segment_cmd(name, hi, lo)
        meta = self.m(name)
        return MergeSegments(meta.sid, tiered.segment)

    def tier(self, name: str, hi: int | None = None) -> Outcome:
        return self.one(self.segment_cmd(name, hi))

    def evict(self, name: str, upto: int | None = None) -> Outcome:
        meta = self.m(name)
        return self.one(Evict(meta.sid, meta.tiered if upto is None else upto))

    def cold_parts(
        self, name: str, start: int = 0, max_bytes: int = BIG, sm: StateMachine | None = None
    ) -> list[bytes]:
        sm = sm or self.sm
        meta = sm.lookup(B, name)
        assert meta is not None
        pos, parts = start, []
        while True:
            chunk = sm.read(meta, pos, max_bytes, self.cold)
            parts += [bytes(p) for p in chunk.payloads]
            if chunk.next_pos >= meta.tail:
                assert chunk.next_pos == meta.tail
                return parts
            assert chunk.next_pos > pos, "a read must make progress"
            pos = chunk.next_pos

    def cold_text(self, name: str, start: int = 0, max_bytes: int = BIG) -> bytes:
        return b"".join(self.cold_parts(name, start, max_bytes))

    def cold_json(self, name: str, start: int = 0, max_bytes: int = BIG) -> list:
        return json.loads(b"[" + b",".join(self.cold_parts(name, start, max_bytes)) + b"]")

    def local_positions(self, name: str) -> list[int]:
        sid = self.m(name).sid
        return [r.data_pos(k) for k, _ in self.kv.scan(r.DATA, r.data_key(sid, 0), r.data_key(sid + 1, 0))]

    def gc_queue(self) -> set[str]:
        return {k.decode() for k, _ in self.kv.scan(r.GC_QUEUE, b"")}

    def counters(self) -> tuple[int, int]:
        return self.sm.untiered_bytes, self.sm.local_bytes

    def reopened_counters(self) -> tuple[int, int]:
        again = StateMachine(self.kv)
        return again.untiered_bytes, again.local_bytes

    def state(self, but_queue: bool = False) -> tuple:
        """Everything a rejected command must leave alone (the applied index aside; with `but_queue`,
        the deletion queue too: a stale upload queues its object)."""
        kv = dump(self.kv)
        kv.pop(r.SM_META)
        if but_queue:
            kv.pop(r.GC_QUEUE)
        metas = {sid: r.encode(meta) for sid, meta in self.sm.streams.items()}
        return kv, metas, self.counters()


def filled(name: str = "s", payloads: tuple[bytes, ...] = (b"aaa", b"bb", b"cccc", b"d"), ct: str = OCTET) -> TH:
    """A harness with one stream holding the given records (starts 0, 3, 5, 9; tail 10 by default)."""
    h = TH()
    assert h.create(name, ct).code is Code.CREATED
    for p in payloads:
        assert h.append(name, p, ct=ct).code is Code.APPENDED
    return h


def replay(batches: list[list[Entry]]) -> tuple[MemoryKV, list]:
    kv = MemoryKV(r.COLUMN_FAMILIES)
    sm = StateMachine(kv)
    outcomes = [o for batch in batches for o in sm.apply(batch)]
    return kv, outcomes
