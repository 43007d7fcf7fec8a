"""Queries over the stream table: lookup, listings, record boundaries, and reads through fork chains.

A fork stores only its own records; positions below its fork point come
from its source (recursively), so reading a fork walks the chain.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol

import msgspec

from app.state_machine import records as r
from app.state_machine.table import StreamTable

_raw_list = msgspec.json.Decoder(list[msgspec.Raw])
_raw = msgspec.json.Decoder(msgspec.Raw)
_WHITESPACE = re.compile(rb"[ \t\r\n]*")
_TRAILING = re.compile(r"trailing characters \(byte (\d+)\)")
# A fork may start inside a JSON record at most this many messages in: every node finds them in its
# apply, one at a time (a split of the whole record would make an object per message, everywhere).
MAX_JSON_SUB_OFFSET = 10_000


def split_json_record(payload: bytes | memoryview) -> list[bytes]:
    """The messages of a JSON record (stored as messages joined by commas)."""
    return [bytes(m) for m in _raw_list.decode(b"[" + bytes(payload) + b"]")]


def json_prefix(payload: bytes | memoryview, count: int) -> bytes | None:
    """The first `count` messages of a JSON record joined by commas; None if it has fewer.

    It walks the record a message at a time, each skipped by msgspec in C, so it costs the bytes of
    those messages and holds no object per message of the rest.
    """
    view = memoryview(payload)
    size, pos = len(view), 0
    parts: list[bytes] = []
    for _ in range(count):
        pos = _WHITESPACE.match(view, pos).end()  # type: ignore[union-attr]
        if pos >= size:
            return None
        end = _message_end(view, pos)
        parts.append(bytes(view[pos:end]).rstrip(b" \t\r\n"))
        pos = end + 1  # past the comma
    return b",".join(parts)


def _message_end(view: memoryview, pos: int) -> int:
    """Where the message starting at `pos` ends: at the comma after it (whitespace may come before
    the comma), or at the record's end."""
    try:
        _raw.decode(view[pos:])
    except msgspec.DecodeError as exc:
        # msgspec reads one value, then names the byte after the first non-blank character past it.
        found = _TRAILING.search(str(exc))
        comma = pos + int(found.group(1)) - 1 if found else -1
        if comma < pos or view[comma] != 0x2C:
            raise ValueError("not a JSON record") from exc
        return comma
    return len(view)


class ColdMiss(Exception):
    """A read needs a segment that is only in the object store and not in the cache yet."""

    def __init__(self, segment: r.SegmentInfo) -> None:
        super().__init__(segment.key)
        self.segment = segment
        self.partial: Chunk | None = None  # the records read before the miss, if any


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


def lookup(table: StreamTable, bucket: str, name: str) -> r.StreamMeta | None:
    sid = table.names.get((bucket, name))
    return None if sid is None else table.streams[sid]


def bucket_streams(table: StreamTable, bucket: str, prefix: str = "", after: str = "") -> Iterator[r.StreamMeta]:
    """Streams of a bucket in name order, from the committed store."""
    return table.stored_streams(bucket, prefix, after)


def own_record(table: StreamTable, sid: int, pos: int) -> bytes | None:
    """The payload of stream `sid`'s own local record starting at `pos`."""
    raw = table.get(r.DATA, r.data_key(sid, pos))
    return None if raw is None else bytes(r.record_payload(raw))


def owner(table: StreamTable, meta: r.StreamMeta, pos: int) -> r.StreamMeta:
    """The stream in the fork chain whose own records hold position `pos`."""
    while pos < meta.fork_pos and meta.fork_of is not None:
        meta = table.streams[meta.fork_of]
    return meta


def segment_at(table: StreamTable, sid: int, pos: int) -> r.SegmentInfo | None:
    """The tiered segment of stream `sid` holding position `pos`."""
    for segment in segments(table, sid, pos, pos + 1):
        return segment
    return None


def segments(table: StreamTable, sid: int, lo: int, hi: int) -> Iterator[r.SegmentInfo]:
    """Tiered segments of stream `sid` overlapping positions [lo, hi), in order (staged ones too)."""
    start, end = r.data_key(sid, lo), r.data_key(sid, hi)
    found: dict[bytes, bytes] = {}
    first = table.kv.floor(r.SEGMENTS, start)
    if first is not None and first[0][:8] == start[:8]:
        found[first[0]] = first[1]
    found.update(table.kv.scan(r.SEGMENTS, start, end))
    if table.staged:
        table.overlay(found, r.SEGMENTS, r.sid_key(sid), end)
    for key in sorted(found):
        segment = r.decode_segment(found[key])
        if segment.hi > lo and key < end:
            yield segment


def is_boundary(table: StreamTable, meta: r.StreamMeta, pos: int) -> bool:
    if pos in (0, meta.tail):
        return True
    holder = owner(table, meta, pos)
    if pos < holder.evicted:
        segment = segment_at(table, holder.sid, pos)
        return segment is not None and segment.has_start(pos)
    return own_record(table, holder.sid, pos) is not None


def record_length(table: StreamTable, meta: r.StreamMeta, pos: int) -> int | None:
    """The length of the evicted record starting at `pos` (from its segment's boundaries)."""
    holder = owner(table, meta, pos)
    segment = segment_at(table, holder.sid, pos) if pos < holder.evicted else None
    if segment is None or not segment.has_start(pos):
        return None
    following = [s for s in segment.record_starts() if s > pos]
    return (following[0] if following else segment.hi) - pos


def record_prefix(
    table: StreamTable, meta: r.StreamMeta, pos: int, count: int, evicted_record: bytes | None = None
) -> bytes | None:
    """The first `count` bytes (or JSON messages) of the record at `pos`; None if it is shorter.

    A record evicted to the object store is taken from `evicted_record` (the proposer fetched it),
    provided its length matches the record's boundaries.
    """
    if pos >= meta.tail:
        return None
    payload = own_record(table, owner(table, meta, pos).sid, pos)
    if payload is None and evicted_record is not None and record_length(table, meta, pos) == len(evicted_record):
        payload = evicted_record
    if payload is None:
        return None
    if meta.json:
        return json_prefix(payload, count) if count <= MAX_JSON_SUB_OFFSET else None
    return payload[:count] if count <= len(payload) else None


def read(
    table: StreamTable,
    meta: r.StreamMeta,
    pos: int,
    max_bytes: int,
    cold: ColdSource | None = None,
    whole: bool = False,
) -> Chunk:
    """Records from `pos` up to about `max_bytes` (at least one whole JSON record; with `whole`,
    byte records are never cut either).

    Evicted ranges come from `cold`, which raises ColdMiss for a segment it has yet to fetch.
    """
    chunk = Chunk(next_pos=pos)
    try:
        for sid, lo, hi in ranges(table, meta, pos, meta.tail):
            for rec_pos, payload in _pieces(table, sid, lo, hi, meta.json, cold):
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
    except ColdMiss as miss:
        if chunk.payloads:
            miss.partial = chunk  # the caller may answer with it rather than fetch (cache.read_through)
        raise
    return chunk


def local_records(
    table: StreamTable, meta: r.StreamMeta, pos: int, max_bytes: int, max_records: int = 0
) -> tuple[list[tuple[int, bytes]], int] | None:
    """The records that start at or after `pos`, as stored here, (position, stored value) each, up to
    about `max_bytes` (at least one) and at most `max_records` (0: any number), and where the next
    read starts; None when part of the range
    is evicted to the object store (only its segments hold those records now)."""
    out: list[tuple[int, bytes]] = []
    size, next_pos = 0, pos
    for sid, lo, hi in ranges(table, meta, pos, meta.tail):
        if lo < table.streams[sid].evicted:
            return None
        for key, value in table.kv.scan(r.DATA, r.data_key(sid, lo), r.data_key(sid, hi)):
            rec_pos, length = r.data_pos(key), len(r.record_payload(value))
            if out and rec_pos != next_pos:
                return None  # evicted (or deleted) while this read ran
            if out and (size + length > max_bytes or len(out) == max_records):
                return out, next_pos
            out.append((rec_pos, value))
            size, next_pos = size + length, rec_pos + length
    return out, max(next_pos, meta.tail)


def evicted_span(table: StreamTable, meta: r.StreamMeta, pos: int) -> tuple[r.StreamMeta, int]:
    """The stream whose segments hold the first evicted records of `meta` from `pos` (a fork's source
    for what it inherited), and where that evicted run ends in `meta`'s positions."""
    for sid, lo, hi in ranges(table, meta, pos, meta.tail):
        holder = table.streams[sid]
        if lo < holder.evicted:
            return holder, min(hi, holder.evicted)
    return meta, meta.evicted


def ranges(table: StreamTable, meta: r.StreamMeta, start: int, end: int) -> list[tuple[int, int, int]]:
    """(sid, lo, hi) pieces that make up positions [start, end) of `meta`."""
    out: list[tuple[int, int, int]] = []
    if start < meta.fork_pos and meta.fork_of is not None:
        out += ranges(table, table.streams[meta.fork_of], start, min(end, meta.fork_pos))
    if end > meta.fork_pos:
        out.append((meta.sid, max(start, meta.fork_pos), end))
    return out


def _pieces(
    table: StreamTable, sid: int, lo: int, hi: int, json: bool, cold: ColdSource | None
) -> Iterator[tuple[int, memoryview]]:
    ring = table.tail.covering(sid, lo, hi)
    if ring is not None:  # recent records: from memory, evicted or not
        yield from ring.pieces(lo, hi, json)
        return
    evicted = table.streams[sid].evicted
    if lo < evicted:
        if cold is None:
            raise LookupError("reading evicted records needs a cold source")
        cut = min(hi, evicted)
        for segment in segments(table, sid, lo, cut):
            yield from cold.records(segment, max(lo, segment.lo), min(cut, segment.hi))
        lo = cut
    if lo < hi:
        yield from _scan(table, sid, lo, hi, json)


def _scan(table: StreamTable, sid: int, lo: int, hi: int, json: bool) -> Iterator[tuple[int, memoryview]]:
    first = table.kv.floor(r.DATA, r.data_key(sid, lo))
    if first is not None and not json:
        key, value = first
        fsid, fpos = r.U64.unpack(key[:8])[0], r.data_pos(key)
        payload = r.record_payload(value)
        if fsid == sid and fpos < lo < fpos + len(payload):
            yield lo, payload[lo - fpos :]
    for key, value in table.kv.scan(r.DATA, r.data_key(sid, lo), r.data_key(sid, hi)):
        yield r.data_pos(key), r.record_payload(value)
