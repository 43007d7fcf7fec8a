"""Sealed segments: Parquet files of stored records, their object keys, and the per-stream manifest.

One row per stored record, zstd-compressed, row groups of about 1 MiB so a reader can fetch or
skip them by their statistics. pyarrow, Spark and DuckDB read these files with no Rill code.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import TypeVar

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq

from app.domain.offsets import format_offset
from app.tiering import keys

FORMAT_VERSION = 1  # of the Parquet files (segments and packs)
MANIFEST_FORMAT = 2  # 2: entries may be slices of packs (`group` >= 0), with `path` relative to the manifest
ROW_GROUP_BYTES = 1 << 20

SCHEMA = pa.schema(
    [
        pa.field("bucket", pa.string(), nullable=False),
        pa.field("stream", pa.string(), nullable=False),
        pa.field("offset", pa.string(), nullable=False),
        pa.field("next_offset", pa.string(), nullable=False),
        pa.field("append_time", pa.timestamp("ms", tz="UTC"), nullable=False),
        pa.field("content_type", pa.string(), nullable=False),
        pa.field("producer_id", pa.string()),
        pa.field("producer_epoch", pa.int64()),
        pa.field("producer_seq", pa.int64()),
        pa.field("payload", pa.binary(), nullable=False),
    ]
)


@dataclass(frozen=True)
class Record:
    pos: int
    time: int  # ms since the epoch
    payload: bytes | memoryview
    producer: tuple[str, int, int] | None = None  # id, epoch, seq


def offset_of(token: str) -> int:
    """The position an offset token stands for (its last 16 digits)."""
    return int(token[-16:])


def stream_dir(bucket: str, stream: str) -> str:
    """The key prefix of a stream's objects (see `keys`: percent-encoded, or hashed when long)."""
    return keys.stream_dir(bucket, stream)


def segment_key(bucket: str, stream: str, lo: int, hi: int) -> str:
    return f"{stream_dir(bucket, stream)}/segments/{format_offset(lo)}-{format_offset(hi)}.parquet"


def manifest_key(bucket: str, stream: str) -> str:
    return f"{stream_dir(bucket, stream)}/manifest.json"


def parse_key(key: str) -> tuple[str, str, int | None] | None:
    """(bucket, stream, first position) of a segment key, or (bucket, stream, None) of a manifest key.

    None for other keys, and for keys in a hashed directory: only its manifest knows the name.
    """
    parsed = keys.parse(key)
    if parsed is None:
        return None
    bucket, component, lo = parsed
    name = keys.name_of(component)
    return None if name is None else (bucket, name, lo)


def build(bucket: str, stream: str, content_type: str, records: Sequence[Record]) -> bytes:
    """A Parquet file of consecutive records (the first one's position is where the segment starts)."""
    return build_view(bucket, stream, content_type, records).tobytes()


def build_view(bucket: str, stream: str, content_type: str, records: Sequence[Record]) -> memoryview:
    """As `build`, as a view of the buffer Arrow wrote it into (no copy of a large segment)."""
    if not records:
        raise ValueError("a segment holds at least one record")
    sink = pa.BufferOutputStream()
    lo, hi = records[0].pos, records[-1].pos + len(records[-1].payload)
    metadata = {
        b"rill.format": str(FORMAT_VERSION).encode(),
        b"rill.first": str(lo).encode(),
        b"rill.next": str(hi).encode(),
    }
    schema = SCHEMA.with_metadata(metadata)
    # Payloads get neither statistics nor a dictionary: both copy every payload (a large record
    # several times over) and neither helps a reader, who seeks by offset.
    columns = [f.name for f in schema if f.name != "payload"]
    with pq.ParquetWriter(sink, schema, compression="zstd", write_statistics=columns, use_dictionary=columns) as writer:
        for group in _row_groups(records):
            writer.write_table(table_of(bucket, stream, content_type, group, schema), row_group_size=len(group))
    return memoryview(sink.getvalue())


def arrow_stream(bucket: str, stream: str, content_type: str, records: Sequence[Record]) -> bytes:
    """Records as an Arrow IPC stream with the segments' schema (the records route's body)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, SCHEMA) as writer:
        if records:
            writer.write_table(table_of(bucket, stream, content_type, records, SCHEMA))
    return sink.getvalue().to_pybytes()


def release_memory() -> None:
    """Hands memory Arrow keeps for reuse back to the system (after a large segment, it is a lot)."""
    pa.default_memory_pool().release_unused()


def _row_groups(records: Sequence[Record]) -> list[Sequence[Record]]:
    groups: list[Sequence[Record]] = []
    start = size = 0
    for i, rec in enumerate(records):
        if len(rec.payload) >= ROW_GROUP_BYTES and start < i:  # a large record gets a group of its own
            groups.append(records[start:i])
            start, size = i, 0
        size += len(rec.payload) + 64
        if size >= ROW_GROUP_BYTES:
            groups.append(records[start : i + 1])
            start, size = i + 1, 0
    if start < len(records):
        groups.append(records[start:])
    return groups


def table_of(bucket: str, stream: str, content_type: str, records: Sequence[Record], schema: pa.Schema) -> pa.Table:
    n = len(records)
    producers = [rec.producer for rec in records]
    return pa.Table.from_arrays(
        [
            pa.array([bucket] * n, pa.string()),
            pa.array([stream] * n, pa.string()),
            pa.array([format_offset(rec.pos) for rec in records], pa.string()),
            pa.array([format_offset(rec.pos + len(rec.payload)) for rec in records], pa.string()),
            pa.array([rec.time for rec in records], pa.timestamp("ms", tz="UTC")),
            pa.array([content_type] * n, pa.string()),
            pa.array([p[0] if p else None for p in producers], pa.string()),
            pa.array([p[1] if p else None for p in producers], pa.int64()),
            pa.array([p[2] if p else None for p in producers], pa.int64()),
            _payloads(records),
        ],
        schema=schema,
    )


def _payloads(records: Sequence[Record]) -> pa.Array:
    """The payload column; one record's payload is wrapped, not copied (a large record has its own group)."""
    if len(records) != 1:
        return pa.array([bytes(rec.payload) for rec in records], pa.binary())
    payload = records[0].payload
    offsets = pa.py_buffer(struct.pack("<ii", 0, len(payload)))
    return pa.Array.from_buffers(pa.binary(), 1, [None, offsets, pa.py_buffer(payload)])


@dataclass
class Loaded:
    """A segment decoded for serving reads: record starts and payloads, in order."""

    positions: list[int]
    payloads: list[memoryview]
    size: int


def load(data: bytes) -> Loaded:
    """Decodes a segment; payloads are views into one decoded buffer, not a copy per record."""
    file = pq.ParquetFile(pa.BufferReader(data))
    meta = file.schema_arrow.metadata or {}
    if int(meta.get(b"rill.format", b"1")) > FORMAT_VERSION:
        raise ValueError(f"segment format {meta[b'rill.format'].decode()} is newer than this Rill reads")
    column = file.read(columns=["payload"]).column("payload").combine_chunks()
    _, offset_buffer, buffer = column.buffers()
    offsets = memoryview(offset_buffer).cast("i")[column.offset : column.offset + len(column) + 1].tolist()
    blob = memoryview(buffer) if buffer is not None else memoryview(b"")
    if b"rill.first" not in meta or b"rill.next" not in meta:
        raise ValueError("not a Rill segment: its range is not in its metadata")
    first = int(meta[b"rill.first"])
    base = offsets[0] if offsets else 0
    positions = [first + o - base for o in offsets[:-1]]
    payloads = [blob[a:b] for a, b in zip(offsets, offsets[1:], strict=False)]
    if first + (offsets[-1] - base if offsets else 0) != int(meta[b"rill.next"]):
        raise ValueError("segment records do not add up to its range")
    return Loaded(positions, payloads, (offsets[-1] - base if offsets else 0) + 64 * len(payloads))


@dataclass
class SegmentEntry:
    """One segment as the manifest lists it."""

    path: str  # relative to the manifest's directory
    first_offset: str
    next_offset: str
    records: int
    bytes: int
    sha256: str
    min_append_time: int  # ms
    max_append_time: int
    group: int = -1  # a pack's slice: its row group, first row there, and SHA-256 of its payloads
    row: int = 0
    digest: str = ""


def entry(bucket: str, stream: str, records: Sequence[Record], data: bytes) -> SegmentEntry:
    """The manifest's entry for a segment file built from `records` (as `build` wrote them)."""
    lo, hi = records[0].pos, records[-1].pos + len(records[-1].payload)
    times = [rec.time for rec in records]
    return SegmentEntry(
        path=segment_key(bucket, stream, lo, hi).removeprefix(stream_dir(bucket, stream) + "/"),
        first_offset=format_offset(lo),
        next_offset=format_offset(hi),
        records=len(records),
        bytes=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        min_append_time=min(times),
        max_append_time=max(times),
    )


@dataclass
class Manifest:
    bucket: str
    stream: str
    content_type: str
    segments: list[SegmentEntry] = field(default_factory=list)
    format: int = MANIFEST_FORMAT

    def to_json(self) -> bytes:
        doc = asdict(self)
        for entry in doc["segments"]:
            if entry["group"] < 0:  # a segment of its own: the fields of format 1 only
                del entry["group"], entry["row"], entry["digest"]
        return json.dumps(doc, indent=1).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> Manifest:
        """A manifest as written; ValueError for anything else (the store's objects are not trusted)."""
        manifest = decode_document(raw, cls, MANIFEST_FORMAT, "manifest")
        if not manifest.stream or not manifest.bucket:
            raise ValueError("a manifest names its bucket and stream")
        for e in manifest.segments:
            check_range(e.first_offset, e.next_offset, e.records)
            if e.bytes < 0 or e.group < -1 or e.row < 0 or "\0" in e.path:
                raise ValueError("a manifest entry has a negative size, group or row, or a NUL in its path")
        return manifest


class _Versioned(msgspec.Struct):
    format: int = 1


T = TypeVar("T")


def decode_document(raw: bytes, kind: type[T], newest: int, what: str) -> T:
    """A JSON document of `kind`, its types checked; ValueError for anything else, or a newer format."""
    try:
        version = msgspec.json.decode(raw, type=_Versioned).format
        if version > newest:
            raise ValueError(f"{what} format {version} is newer than this Rill reads")
        return msgspec.json.decode(raw, type=kind)
    except (msgspec.MsgspecError, RecursionError) as exc:
        raise ValueError(f"not a {what}: {exc}") from None


def check_range(first: str, nxt: str, records: int) -> tuple[int, int]:
    """Positions of an entry's offsets, which must be well formed, in order, and hold a record."""
    if not (_TOKEN.fullmatch(first) and _TOKEN.fullmatch(nxt)):
        raise ValueError(f"malformed offsets {first[:40]!r}, {nxt[:40]!r}")
    lo, hi = offset_of(first), offset_of(nxt)
    if not lo < hi or not 1 <= records <= hi - lo:
        raise ValueError(f"an entry of [{lo}, {hi}) with {records} records")
    return lo, hi


_TOKEN = re.compile(r"0{16}_[0-9]{16}")
