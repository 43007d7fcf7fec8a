"""The cold tier read for the `rill` data source: planned segments and pack slices, rows inside a read's bounds.

The counterpart of app/pipeline/hot.py (the part of each stream still on the servers). A segment of
its own is fetched whole, its row groups dropped by their Parquet statistics. A slice of a pack is
exactly its rows of one row group, read by ranged GETs: the pack's footer once per task, then one GET
per row group that holds planned slices, never the rows of other streams around them. Rows are then
kept by their offset and append time. Batch reads (app/pipeline/datasource.py) and streaming reads
(app/pipeline/streaming.py) both read through here.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from app.pipeline.messages import VALUE, explode, values
from app.pipeline.options import Bounds, ReadOptions, micros
from app.pipeline.planning import PlannedSegment, covering, store_for
from app.tiering.pack import RangedFile
from app.tiering.segment import offset_of
from app.tiering.store import ObjectStore

Columns = list[str] | None  # None: all of them


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


def segment_tables(data: bytes, bounds: Bounds, columns: Columns = None) -> Iterator[pa.Table]:
    """The row groups of a segment that may hold rows inside `bounds`, as read (the segments' schema)."""
    pf = pq.ParquetFile(pa.BufferReader(data))
    for group in pick_row_groups(pf.metadata, bounds):
        # One thread: Spark already runs a task per core, more would only contend with them.
        yield pf.read_row_group(group, columns=columns, use_threads=False)


class PackSlices:
    """Slices of packs for one task: each pack opened once (a GET for its footer), a row group read
    with one ranged GET (pre_buffer coalesces its column chunks) and kept for the slices after it."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store
        self._files: dict[str, pq.ParquetFile] = {}
        self._group: tuple[tuple[str, int, tuple[str, ...] | None], pa.Table] | None = None

    def _file(self, s: PlannedSegment) -> pq.ParquetFile:
        if s.key not in self._files:
            self._files[s.key] = pq.ParquetFile(RangedFile(self.store, s.key, s.size or s.bytes), pre_buffer=True)
        return self._files[s.key]

    def _row_group(self, s: PlannedSegment, columns: Columns) -> pa.Table:
        which = (s.key, s.group, None if columns is None else tuple(columns))
        if self._group is None or self._group[0] != which:
            try:
                file = self._file(s)
                if s.group >= file.metadata.num_row_groups:
                    raise ValueError(f"pack {s.key} has no row group {s.group}")
                self._group = (which, file.read_row_group(s.group, columns=columns, use_threads=False))
            except KeyError:  # the store's "no such object", from a ranged GET
                raise FileNotFoundError(f"pack {s.key} listed in the catalog is missing") from None
        return self._group[1]

    def rows(self, s: PlannedSegment, columns: Columns = None) -> pa.Table:
        """Exactly the slice's rows."""
        table = self._row_group(s, columns)
        if s.row + s.records > table.num_rows:
            raise ValueError(f"pack {s.key} has no rows {s.row}..{s.row + s.records} in row group {s.group}")
        piece = table.slice(s.row, s.records)
        names = piece.column_names
        theirs = (
            ("offset" in names and piece["offset"][0].as_py() != s.first_offset)
            or ("next_offset" in names and piece["next_offset"][-1].as_py() != s.next_offset)
            or ("stream" in names and not pc.all(pc.equal(piece["stream"], s.stream)).as_py())
        )  # an index that overstates a slice's rows would hand out the next stream's
        if theirs:
            raise ValueError(f"rows {s.row}.. of row group {s.group} of pack {s.key} are not {s.stream}'s slice")
        return piece


def planned_tables(
    opts: ReadOptions, planned: Iterable[PlannedSegment], bounds: Bounds, columns: Columns = None
) -> Iterator[pa.Table]:
    """The rows of the planned entries that may be inside `bounds`: a segment's row groups that may hold
    some, a slice's rows. `bounds` are applied to segments' row groups only, rows are left to the caller."""
    slices = PackSlices(store_for(opts))
    for s in planned:
        if s.packed:
            yield _kept(slices.rows(s, columns), s)
        else:
            data = segment_bytes(opts, s.key)
            try:
                for table in segment_tables(data, bounds, columns):
                    yield _kept(table, s)
            except (pa.ArrowException, OSError) as exc:  # not Parquet, or cut short: name the object
                raise ValueError(f"segment {s.key} listed in its manifest cannot be read: {exc}") from exc


def _kept(table: pa.Table, s: PlannedSegment) -> pa.Table:
    """The rows of the entry's own range [first, next) (a manifest may list one object for two), from
    `keep_from` on (what retention kept)."""
    if "offset" not in table.column_names:
        return table
    lo = max(s.first_offset, s.keep_from)
    offsets = table["offset"]
    mask = pc.and_(pc.greater_equal(offsets, lo), pc.less(offsets, s.next_offset))
    return table if pc.all(mask).as_py() else table.filter(mask)


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


def read_planned(
    opts: ReadOptions, planned: Iterable[PlannedSegment], bounds: Bounds, schema: pa.Schema
) -> Iterator[pa.RecordBatch]:
    """The planned entries' rows inside `bounds`, as batches of `schema`, a row group or slice at a time."""
    for table in planned_tables(opts, planned, bounds):
        yield from restrict(table, bounds, schema)


def segment_bytes(opts: ReadOptions, key: str) -> bytes:
    try:
        return store_for(opts).get(key)
    except KeyError:
        raise FileNotFoundError(f"segment {key} listed in its manifest is missing") from None


def segments_between(opts: ReadOptions, stream: str, lo: int, hi: int) -> Iterator[pa.Table]:
    """The records of `stream` starting in [lo, hi), from its segments and pack slices in the store."""
    only, planned = covering(opts, stream, lo, hi)
    for table in planned_tables(opts, planned, only):
        yield table.filter(only.offsets.mask(table["offset"], pa.string()))


def starts_between(opts: ReadOptions, stream: str, lo: int, hi: int) -> Iterator[int]:
    """Where the appends of `stream` that start in [lo, hi) start, from the offsets in its cold entries."""
    only, planned = covering(opts, stream, lo, hi)
    for table in planned_tables(opts, planned, only, ["offset"]):
        offsets = table["offset"]
        mask = only.offsets.mask(offsets, pa.string())
        yield from (offset_of(token) for token in (offsets if mask is None else offsets.filter(mask)).to_pylist())
