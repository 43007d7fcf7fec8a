"""Queries over applied state: stream lookup, listings, and reads through fork chains.

A fork stores only its own records; positions below its fork point come
from its source (recursively), so reading a fork walks the chain.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol

import msgspec

from app.state_machine import records as r
from app.storage.kv import KV

_raw_list = msgspec.json.Decoder(list[msgspec.Raw])


def split_json_record(payload: bytes | memoryview) -> list[bytes]:
    """The messages of a JSON record (stored as messages joined by commas)."""
    return [bytes(m) for m in _raw_list.decode(b"[" + bytes(payload) + b"]")]


class ColdMiss(Exception):
    """A read needs a segment that is only in the object store and not in the cache yet."""

    def __init__(self, segment: r.SegmentInfo) -> None:
        super().__init__(segment.key)
        self.segment = segment


class ColdSource(Protocol):
    def records(self, segment: r.SegmentInfo, lo: int, hi: int) -> Iterator[tuple[int, memoryview]]:
        """The segment's records overlapping [lo, hi), the first cut to start at `lo`.

        Raises ColdMiss if the segment has not been fetched.
        """
        ...


@dataclass
class Chunk:
    """A read: payloads in order and where the next read starts."""

    payloads: list[memoryview] = field(default_factory=list)
    next_pos: int = 0
    size: int = 0


class StreamReader:
    def __init__(self, kv: KV) -> None:
        self.kv = kv
        self.streams: dict[int, r.StreamMeta] = {}
        self.names: dict[tuple[str, str], int] = {}
        # Writes of the apply batch in progress, not yet in the KV: (cf, key) -> value.
        self.staged: dict[tuple[str, bytes], bytes] = {}

    def lookup(self, bucket: str, name: str) -> r.StreamMeta | None:
        sid = self.names.get((bucket, name))
        return None if sid is None else self.streams[sid]

    def bucket_streams(self, bucket: str, prefix: str = "", after: str = "") -> Iterator[r.StreamMeta]:
        """Streams of a bucket in name order, from the committed store."""
        start = r.name_key(bucket, max(prefix, after))
        end = r.name_key(bucket, prefix) + b"\xff" if prefix else bucket.encode() + b"\x01"
        for key, value in self.kv.scan(r.NAMES, start, end):
            name = r.split_name_key(key)[1]
            if after and name <= after:
                continue
            meta = self.streams.get(r.U64.unpack(value)[0])
            if meta is not None:
                yield meta

    def _record(self, sid: int, pos: int) -> bytes | None:
        key = r.data_key(sid, pos)
        raw = self.staged.get((r.DATA, key)) or self.kv.get(r.DATA, key)
        return None if raw is None else bytes(r.record_payload(raw))

    def owner(self, meta: r.StreamMeta, pos: int) -> r.StreamMeta:
        """The stream in the fork chain whose own records hold position `pos`."""
        while pos < meta.fork_pos and meta.fork_of is not None:
            meta = self.streams[meta.fork_of]
        return meta

    def segment_at(self, sid: int, pos: int) -> r.SegmentInfo | None:
        """The tiered segment of stream `sid` holding position `pos`."""
        for segment in self.segments(sid, pos, pos + 1):
            return segment
        return None

    def segments(self, sid: int, lo: int, hi: int) -> Iterator[r.SegmentInfo]:
        """Tiered segments of stream `sid` overlapping positions [lo, hi), in order (staged ones too)."""
        start, end = r.data_key(sid, lo), r.data_key(sid, hi)
        found: dict[bytes, bytes] = {}
        first = self.kv.floor(r.SEGMENTS, start)
        if first is not None and first[0][:8] == start[:8]:
            found[first[0]] = first[1]
        found.update(self.kv.scan(r.SEGMENTS, start, end))
        if self.staged:
            staged = self.staged.items()
            found.update({k: v for (cf, k), v in staged if cf == r.SEGMENTS and k[:8] == start[:8] and k < end})
        for key in sorted(found):
            segment = r.decode_segment(found[key])
            if segment.hi > lo and key < end:
                yield segment

    def is_boundary(self, meta: r.StreamMeta, pos: int) -> bool:
        if pos in (0, meta.tail):
            return True
        owner = self.owner(meta, pos)
        if pos < owner.evicted:
            segment = self.segment_at(owner.sid, pos)
            return segment is not None and segment.has_start(pos)
        return self._record(owner.sid, pos) is not None

    def record_length(self, meta: r.StreamMeta, pos: int) -> int | None:
        """The length of the evicted record starting at `pos` (from its segment's boundaries)."""
        owner = self.owner(meta, pos)
        segment = self.segment_at(owner.sid, pos) if pos < owner.evicted else None
        if segment is None or not segment.has_start(pos):
            return None
        following = [s for s in segment.record_starts() if s > pos]
        return (following[0] if following else segment.hi) - pos

    def record_prefix(
        self, meta: r.StreamMeta, pos: int, count: int, evicted_record: bytes | None = None
    ) -> bytes | None:
        """The first `count` bytes (or JSON messages) of the record at `pos`; None if it is shorter.

        A record evicted to the object store is taken from `evicted_record` (the proposer fetched it),
        provided its length matches the record's boundaries.
        """
        if pos >= meta.tail:
            return None
        payload = self._record(self.owner(meta, pos).sid, pos)
        if payload is None and evicted_record is not None and self.record_length(meta, pos) == len(evicted_record):
            payload = evicted_record
        if payload is None:
            return None
        if meta.json:
            messages = split_json_record(payload)
            return b",".join(messages[:count]) if count <= len(messages) else None
        return payload[:count] if count <= len(payload) else None

    def _ranges(self, meta: r.StreamMeta, start: int, end: int) -> list[tuple[int, int, int]]:
        """(sid, lo, hi) pieces that make up positions [start, end) of `meta`."""
        out: list[tuple[int, int, int]] = []
        if start < meta.fork_pos and meta.fork_of is not None:
            out += self._ranges(self.streams[meta.fork_of], start, min(end, meta.fork_pos))
        if end > meta.fork_pos:
            out.append((meta.sid, max(start, meta.fork_pos), end))
        return out

    def read(
        self, meta: r.StreamMeta, pos: int, max_bytes: int, cold: ColdSource | None = None, whole: bool = False
    ) -> Chunk:
        """Records from `pos` up to about `max_bytes` (at least one whole JSON record; with `whole`,
        byte records are never cut either).

        Evicted ranges come from `cold`, which raises ColdMiss for a segment it has yet to fetch.
        """
        chunk = Chunk(next_pos=pos)
        for sid, lo, hi in self._ranges(meta, pos, meta.tail):
            for rec_pos, payload in self._pieces(sid, lo, hi, meta.json, cold):
                room = max_bytes - chunk.size
                keep_whole = meta.json or whole
                if len(payload) > room and chunk.payloads and keep_whole:
                    return chunk
                if len(payload) > room and not keep_whole:
                    payload = payload[: max(room, 1)]
                chunk.payloads.append(payload)
                chunk.size += len(payload)
                chunk.next_pos = rec_pos + len(payload)
                if chunk.size >= max_bytes:
                    return chunk
        return chunk

    def _pieces(
        self, sid: int, lo: int, hi: int, json: bool, cold: ColdSource | None
    ) -> Iterator[tuple[int, memoryview]]:
        evicted = self.streams[sid].evicted
        if lo < evicted:
            if cold is None:
                raise LookupError("reading evicted records needs a cold source")
            cut = min(hi, evicted)
            for segment in self.segments(sid, lo, cut):
                yield from cold.records(segment, max(lo, segment.lo), min(cut, segment.hi))
            lo = cut
        if lo < hi:
            yield from self._scan(sid, lo, hi, json)

    def _scan(self, sid: int, lo: int, hi: int, json: bool) -> Iterator[tuple[int, memoryview]]:
        first = self.kv.floor(r.DATA, r.data_key(sid, lo))
        if first is not None and not json:
            key, value = first
            fsid, fpos = r.U64.unpack(key[:8])[0], r.data_pos(key)
            payload = r.record_payload(value)
            if fsid == sid and fpos < lo < fpos + len(payload):
                yield lo, payload[lo - fpos :]
        for key, value in self.kv.scan(r.DATA, r.data_key(sid, lo), r.data_key(sid, hi)):
            yield r.data_pos(key), r.record_payload(value)
