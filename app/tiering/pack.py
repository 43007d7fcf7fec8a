"""Packs: the sealed records of many small streams of one bucket in one Parquet object.

A stream sealed by age with little data would otherwise make an object (and a manifest) of its
own, so the object count would follow the number of streams rather than their bytes. A pack has
the segments' schema and rows, each stream's records contiguous (a *slice*); row groups end only
between slices, so a slice is read with one ranged GET of its row group's payload column once the
pack's footer is known. pyarrow, Spark and DuckDB read a pack like any segment.

Keys are `{bucket}/!packs/{digest}.parquet`, named by their content; `!` is never produced by
percent-encoding, so no stream's directory can be called that. Each pack has an index beside it,
`{digest}.json`, listing its live slices; the tiering worker rewrites it when a slice is dropped.
"""

from __future__ import annotations

import hashlib
import io
import json
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq

from app.state_machine.cold_tier import PACKS_DIRECTORY
from app.tiering import segment as seg
from app.tiering.store import ObjectStore

FORMAT_VERSION = 1  # of the index; the Parquet rows are the segments' (segment.FORMAT_VERSION)
DIRECTORY = PACKS_DIRECTORY
GROUP_BYTES = 256 << 10  # a row group closes at the first slice boundary past this


@dataclass(frozen=True)
class Slice:
    """One stream's records to pack."""

    stream: str
    content_type: str
    records: Sequence[seg.Record]


@dataclass(frozen=True)
class Placement:
    group: int  # row group of the pack
    row: int  # the slice's first row in that group


def pack_key(bucket: str, digest: str) -> str:
    return f"{bucket}/{DIRECTORY}/{digest[:40]}.parquet"


def slice_digest(payloads: Sequence[bytes | memoryview]) -> str:
    """What a slice's SegmentInfo records to check its records by: SHA-256 of the payloads in order."""
    digest = hashlib.sha256()
    for payload in payloads:
        digest.update(payload)
    return digest.hexdigest()


def build(bucket: str, slices: Sequence[Slice]) -> tuple[memoryview, list[Placement]]:
    """The pack's Parquet bytes, and where each slice landed."""
    if not slices or any(not s.records for s in slices):
        raise ValueError("a pack holds at least one slice, each of at least one record")
    schema = seg.SCHEMA.with_metadata({b"rill.format": str(seg.FORMAT_VERSION).encode(), b"rill.kind": b"pack"})
    columns = [f.name for f in schema if f.name != "payload"]
    placements: list[Placement] = []
    sink = pa.BufferOutputStream()
    with pq.ParquetWriter(sink, schema, compression="zstd", write_statistics=columns, use_dictionary=columns) as w:
        tables: list[pa.Table] = []
        group = rows = size = 0
        for piece in slices:
            placements.append(Placement(group, rows))
            tables.append(seg.table_of(bucket, piece.stream, piece.content_type, piece.records, schema))
            rows += len(piece.records)
            size += sum(len(rec.payload) + 64 for rec in piece.records)
            if size >= GROUP_BYTES:
                w.write_table(pa.concat_tables(tables), row_group_size=rows)
                tables, rows, size, group = [], 0, 0, group + 1
        if tables:
            w.write_table(pa.concat_tables(tables), row_group_size=rows)
    return memoryview(sink.getvalue()), placements


class RangedFile(io.RawIOBase):
    """A store object as a seekable file that fetches each read with a ranged GET (pyarrow reads a
    footer and then one column chunk at a time, so a slice costs one GET once the footer is known)."""

    def __init__(self, store: ObjectStore, key: str, size: int) -> None:
        self.store, self.key, self.size, self.pos = store, key, size, 0
        self.gets = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence]
        self.pos = base + offset
        return self.pos

    def read(self, n: int = -1) -> bytes:
        end = self.size if n < 0 else min(self.size, self.pos + n)
        if end <= self.pos:
            return b""
        data = self.store.get_range(self.key, self.pos, end)
        self.gets += 1
        self.pos += len(data)
        return data

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


class PackReader:
    """Reads slices out of packs by ranged GETs, keeping the footers of recently read packs."""

    def __init__(self, store: ObjectStore, max_footers: int = 256) -> None:
        self.store = store
        self.max_footers = max_footers
        self._footers: OrderedDict[str, pq.FileMetaData] = OrderedDict()
        self._lock = threading.Lock()  # reads run on several threads at once

    def rows(self, key: str, size: int, group: int, row: int, count: int, columns: list[str]) -> pa.Table:
        """`columns` of rows [row, row + count) of row group `group` of the pack at `key`."""
        with self._lock:
            footer = self._footers.get(key)
        parquet = pq.ParquetFile(RangedFile(self.store, key, size), metadata=footer)
        with self._lock:
            self._footers[key] = footer if footer is not None else parquet.metadata
            self._footers.move_to_end(key)
            while len(self._footers) > self.max_footers:
                self._footers.popitem(last=False)
        return rows_of(parquet, key, group, row, count, columns)

    def payloads(self, key: str, size: int, group: int, row: int, count: int) -> list[memoryview]:
        """The payloads of rows [row, row + count) of row group `group`, as views of one buffer."""
        column = self.rows(key, size, group, row, count, ["payload"]).column(0).combine_chunks()
        if column.type != pa.binary():
            raise ValueError(f"pack {key} has payloads of type {column.type}")
        _, offset_buffer, buffer = column.buffers()
        offsets = memoryview(offset_buffer).cast("i")[column.offset : column.offset + count + 1].tolist()
        blob = memoryview(buffer) if buffer is not None else memoryview(b"")
        return [blob[a:b] for a, b in zip(offsets, offsets[1:], strict=False)]


def rows_of(parquet: pq.ParquetFile, key: str, group: int, row: int, count: int, columns: list[str]) -> pa.Table:
    """`columns` of rows [row, row + count) of row group `group`; ValueError if the pack has no such rows."""
    footer = parquet.metadata
    rows_there = footer.row_group(group).num_rows if 0 <= group < footer.num_row_groups else 0
    if row < 0 or count < 1 or row + count > rows_there:
        raise ValueError(f"pack {key} has no rows {row}..{row + count} in row group {group}")
    table = parquet.read_row_group(group, columns=columns, use_threads=False)
    if table.column_names != columns:
        raise ValueError(f"pack {key} lacks columns {columns}")
    return table.slice(row, count)


@dataclass
class IndexEntry:
    """One live slice as a pack's index lists it (offsets are tokens, as in manifests)."""

    stream: str
    content_type: str
    first_offset: str
    next_offset: str
    records: int
    group: int
    row: int
    sha256: str  # of the slice's payloads (`slice_digest`)
    min_append_time: int
    max_append_time: int


@dataclass
class PackIndex:
    bucket: str
    path: str  # the pack's file name, beside this index
    size: int
    sha256: str  # of the whole pack
    slices: list[IndexEntry] = field(default_factory=list)
    format: int = FORMAT_VERSION
    rejected: int = 0  # slices of the document read that were not well formed (never written)

    def to_json(self) -> bytes:
        doc = asdict(self)
        del doc["rejected"]
        return json.dumps(doc, indent=1).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> PackIndex:
        """An index as written; ValueError for anything else (the store's objects are not trusted). A
        slice that is not well formed is left out and counted in `rejected`; the others stay usable."""
        doc = seg.decode_document(raw, _RawIndex, FORMAT_VERSION, "pack index")
        if doc.size < 0 or not doc.bucket:
            raise ValueError("a pack index names its bucket and a size")
        index = cls(doc.bucket, doc.path, doc.size, doc.sha256, format=doc.format)
        for raw_slice in doc.slices:
            try:
                s = seg.decode_document(raw_slice, IndexEntry, FORMAT_VERSION, "pack index slice")
                seg.check_range(s.first_offset, s.next_offset, s.records)
                if not s.stream or s.group < 0 or s.row < 0:
                    raise ValueError("an index slice names its stream, a row group and a row")
            except ValueError:
                index.rejected += 1
                continue
            index.slices.append(s)
        return index


class _RawIndex(msgspec.Struct):
    bucket: str
    path: str
    size: int
    sha256: str
    slices: list[msgspec.Raw] = []
    format: int = FORMAT_VERSION
