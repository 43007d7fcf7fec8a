"""The cold tier's segments, read for the `rill` data source: row groups and rows inside a read's bounds.

The counterpart of app/pipeline/hot.py (the part of each stream still on the servers). Row groups are
dropped by their Parquet statistics, then rows by their offset and append time. Batch reads
(app/pipeline/datasource.py) and streaming reads (app/pipeline/streaming.py) both read through here.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from app.pipeline.messages import VALUE, explode, values
from app.pipeline.options import Bounds, ReadOptions, micros
from app.pipeline.planning import covering, store_for
from app.tiering.segment import offset_of


def pick_row_groups(meta: pq.FileMetaData, bounds: Bounds) -> list[int]:
    """The row groups whose statistics may hold rows inside `bounds` (all of them when stats are missing)."""
    names = meta.schema.to_arrow_schema().names
    off_i, time_i = names.index("offset"), names.index("append_time")
    keep = []
    for i in range(meta.num_row_groups):
        rg = meta.row_group(i)
        off, ts = rg.column(off_i).statistics, rg.column(time_i).statistics
        if off is not None and off.has_min_max and not bounds.offsets.overlaps(off.min, off.max):
            continue
        if ts is not None and ts.has_min_max and not bounds.times.overlaps(micros(ts.min, ""), micros(ts.max, "")):
            continue
        keep.append(i)
    return keep


def segment_tables(data: bytes, bounds: Bounds) -> Iterator[pa.Table]:
    """The row groups of a segment that may hold rows inside `bounds`, as read (the segments' schema)."""
    pf = pq.ParquetFile(pa.BufferReader(data))
    for group in pick_row_groups(pf.metadata, bounds):
        # One thread: Spark already runs a task per core, more would only contend with them.
        yield pf.read_row_group(group, use_threads=False)


def restrict(table: pa.Table, bounds: Bounds, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """The rows of `table` inside `bounds`, as batches of `schema` (Spark's Arrow types): a row per
    JSON message, with `value` when the schema has it."""
    table = explode(table)
    if VALUE in schema.names:
        kind = schema.field(VALUE).type
        table = table.append_column(pa.field(VALUE, kind), values(table, kind))
    table = table.cast(schema)
    for rng, column, kind in (
        (bounds.offsets, "offset", pa.string()),
        (bounds.times, "append_time", pa.timestamp("us", tz="UTC")),
    ):
        mask = rng.mask(table[column], kind)
        if mask is not None and not pc.all(mask).as_py():
            table = table.filter(mask)
    yield from table.to_batches()


def read_segment(data: bytes, bounds: Bounds, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """The segment's rows inside `bounds`, as batches of `schema`, a row group at a time."""
    for table in segment_tables(data, bounds):
        yield from restrict(table, bounds, schema)


def segment_bytes(opts: ReadOptions, key: str) -> bytes:
    try:
        return store_for(opts).get(key)
    except KeyError:
        raise FileNotFoundError(f"segment {key} listed in its manifest is missing") from None


def segments_between(opts: ReadOptions, stream: str, lo: int, hi: int) -> Iterator[pa.Table]:
    """The records of `stream` starting in [lo, hi), from its segments in the store."""
    only, segments = covering(opts, stream, lo, hi)
    for seg in segments:
        for table in segment_tables(segment_bytes(opts, seg.key), only):
            yield table.filter(only.offsets.mask(table["offset"], pa.string()))


def starts_between(opts: ReadOptions, stream: str, lo: int, hi: int) -> Iterator[int]:
    """Where the appends of `stream` that start in [lo, hi) start, from the offsets in its segments."""
    only, segments = covering(opts, stream, lo, hi)
    for seg in segments:
        offsets = pq.read_table(pa.BufferReader(segment_bytes(opts, seg.key)), columns=["offset"])["offset"]
        mask = only.offsets.mask(offsets, pa.string())
        yield from (offset_of(token) for token in (offsets if mask is None else offsets.filter(mask)).to_pylist())
