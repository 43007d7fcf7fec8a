"""The `rill` Spark data source: sealed segments of the cold tier as a DataFrame, one partition per segment.

Planning reads only manifests; filters on stream, offset and append time (pushed down by Spark or given
as options) drop whole segments there, then row groups by their Parquet statistics, then rows.
Everything pickled to executors is plain data: stores (boto3 clients) are opened in the worker.
`max_partition_bytes` packs consecutive segments into one partition: every Spark task costs tens of ms,
which small segments (sealed at 8 MiB or after a minute) would otherwise drown in.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterable, Iterator, Mapping, MutableMapping
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import quote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql import datasource as sds
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema
from pyspark.sql.types import StructField, StructType

from app.domain.offsets import format_offset
from app.pipeline.hot import list_tails, read_range
from app.pipeline.messages import VALUE, explode, values, with_ordinal
from app.pipeline.options import STREAM_ONLY, Bounds, Range, ReadOptions, micros, narrow
from app.tiering.keys import HASHED, manifest_candidates
from app.tiering.segment import SCHEMA, Manifest, offset_of
from app.tiering.store import ObjectStore, StoreOptions, open_store

# The segments' columns, and each message's place in its append (see app/pipeline/messages.py).
SPARK_SCHEMA: StructType = from_arrow_schema(with_ordinal(SCHEMA))


@dataclass
class SegmentPartition(sds.InputPartition):
    """One segment to read: its object key in the store and its manifest entry's range."""

    stream: str
    key: str
    first_offset: str
    next_offset: str
    records: int
    bytes: int


@dataclass
class SegmentGroup(sds.InputPartition):
    """What one Spark task reads: consecutive segments."""

    segments: list[SegmentPartition]


def pack(segments: list[SegmentPartition], max_bytes: int, min_partitions: int = 1) -> list[SegmentGroup]:
    """Segments in runs of about equal bytes: enough runs to keep each under `max_bytes` (0: a run per segment)
    and at least `min_partitions` of them while there are segments to spread, so every core gets work."""
    if max_bytes <= 0:
        return [SegmentGroup([s]) for s in segments]
    total = sum(s.bytes for s in segments)
    n = min(len(segments), max(min_partitions, -(-total // max_bytes)))
    groups: list[SegmentGroup] = []
    done = 0
    for i, seg in enumerate(segments):
        # A new run once the segment's middle passes this run's share of bytes, or when each remaining
        # segment must start one.
        short = n - len(groups)
        passed = done + seg.bytes / 2 > total * len(groups) / n
        if not groups or (short > 0 and (passed or len(segments) - i <= short)):
            groups.append(SegmentGroup([]))
        groups[-1].segments.append(seg)
        done += seg.bytes
    return groups


_STORES: dict[tuple[str, StoreOptions], ObjectStore] = {}
MANIFEST_WAITS, MANIFEST_WAIT_SECONDS = 20, 0.5


def store_for(opts: ReadOptions) -> ObjectStore:
    """One store (boto3 client) per worker process and options, reused across tasks."""
    key = (opts.store, opts.s3)
    if key not in _STORES:
        _STORES[key] = open_store(opts.store, opts.s3)
    return _STORES[key]


def _manifest_keys(store: ObjectStore, opts: ReadOptions, bounds: Bounds) -> list[str]:
    if opts.stream is not None:
        return manifest_candidates(opts.bucket, opts.stream)
    if bounds.streams is not None:  # pushed `stream = …` / `stream IN (…)`: no listing needed
        names = [s for s in sorted(bounds.streams) if s.startswith(opts.prefix or "")]
        return [key for name in names for key in manifest_candidates(opts.bucket, name)]
    # A stream's directory name has no '/', so its manifest is exactly `{bucket}/{name}/manifest.json`.
    # Long names have hashed directories: those are listed whatever the prefix, and `plan` keeps the
    # ones whose manifest names a matching stream.
    prefixes = [f"{opts.bucket}/"]
    if opts.prefix:
        prefixes = [f"{opts.bucket}/{HASHED}", f"{opts.bucket}/{quote(opts.prefix, safe='-_.~')}"]
    listed = (key for prefix in prefixes for key in store.list(prefix))
    return [k for k in listed if k.endswith("/manifest.json") and k.count("/") == 2]


def plan(options: Mapping[str, str] | ReadOptions, bounds: Bounds | None = None) -> list[SegmentPartition]:
    """The segments a read with these options (and pushed-down `bounds`) has to open, in stream/offset order."""
    return plan_streams(options, bounds)[0]


def plan_streams(
    options: Mapping[str, str] | ReadOptions, bounds: Bounds | None = None
) -> tuple[list[SegmentPartition], dict[str, tuple[int, int]]]:
    """`plan`'s segments, and where each stream's own segments start and end (by its manifest)."""
    opts = options if isinstance(options, ReadOptions) else ReadOptions.parse(options)
    b = bounds or opts.bounds
    ends: dict[str, tuple[int, int]] = {}
    if b.nothing:
        return [], ends
    store = store_for(opts)
    out: list[SegmentPartition] = []
    for key in _manifest_keys(store, opts, b):
        try:
            manifest = Manifest.from_json(store.get(key))
        except KeyError:  # no such stream, or dropped since the listing
            continue
        name = manifest.stream
        if (b.streams is not None and name not in b.streams) or not name.startswith(opts.prefix or ""):
            continue
        if opts.stream is not None and name != opts.stream:
            continue
        base = key[: -len("manifest.json")]
        if manifest.segments:
            head, last = manifest.segments[0], manifest.segments[-1]
            ends[name] = (offset_of(head.first_offset), offset_of(last.next_offset))
        for seg in manifest.segments:
            in_offsets = b.offsets.overlaps(seg.first_offset, seg.next_offset, most_open=True)
            if in_offsets and b.times.overlaps(seg.min_append_time * 1000, seg.max_append_time * 1000):
                path, first, nxt = base + seg.path, seg.first_offset, seg.next_offset
                out.append(SegmentPartition(name, path, first, nxt, seg.records, seg.bytes))
    return out, ends


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
    only = Bounds(offsets=Range(format_offset(lo), False, format_offset(hi), True))
    for seg in _covering(opts, stream, hi, only):
        for table in segment_tables(segment_bytes(opts, seg.key), only):
            yield table.filter(only.offsets.mask(table["offset"], pa.string()))


def _covering(opts: ReadOptions, stream: str, hi: int, only: Bounds) -> list[SegmentPartition]:
    """The segments within `only`, once the manifest reaches `hi`: the server evicts records after
    tiering them, and the manifest that lists their segments may be published a moment later."""
    for _ in range(MANIFEST_WAITS):
        segments, spans = plan_streams(replace(opts, stream=stream, prefix=None), only)
        if spans.get(stream, (0, 0))[1] >= hi:
            return segments
        time.sleep(MANIFEST_WAIT_SECONDS)
    raise FileNotFoundError(f"the manifest of {opts.bucket}/{stream} does not reach {format_offset(hi)} yet")


def starts_between(opts: ReadOptions, stream: str, lo: int, hi: int) -> Iterator[int]:
    """Where the appends of `stream` that start in [lo, hi) start, from the offsets in its segments."""
    only = Bounds(offsets=Range(format_offset(lo), False, format_offset(hi), True))
    for seg in _covering(opts, stream, hi, only):
        offsets = pq.read_table(pa.BufferReader(segment_bytes(opts, seg.key)), columns=["offset"])["offset"]
        mask = only.offsets.mask(offsets, pa.string())
        yield from (offset_of(token) for token in (offsets if mask is None else offsets.filter(mask)).to_pylist())


@dataclass
class HotPartition(sds.InputPartition):
    """A stream's records from the end of its tiered part to its tail when the read was planned."""

    stream: str
    lo: int
    hi: int


class RillReader(sds.DataSourceReader):
    def __init__(self, opts: ReadOptions, schema: StructType) -> None:
        self.opts = opts
        self.bounds = opts.bounds
        self.arrow_schema = to_arrow_schema(schema, timezone="UTC")

    def pushFilters(self, filters: list[sds.Filter]) -> Iterable[sds.Filter]:  # noqa: N802 (Spark's name)
        for f in filters:
            self.bounds = narrow(self.bounds, f, self.opts.bucket)
        # Every filter goes back to Spark, which re-checks rows: here they only prune, never decide.
        return list(filters)

    def partitions(self) -> list[sds.InputPartition]:
        opts = self.opts
        # The tails first: a segment tiered after the listing then shows up in the manifests too,
        # and its records are read from it rather than skipped.
        tails = {} if opts.server is None else list_tails(opts.server, opts.bucket, opts.stream, opts.prefix)
        segments, spans = plan_streams(opts, self.bounds)
        out: list[sds.InputPartition] = list(pack(segments, opts.max_partition_bytes, opts.min_partitions))
        for name, tail in sorted(tails.items()):
            if self.bounds.nothing or (self.bounds.streams is not None and name not in self.bounds.streams):
                continue
            first, end = spans.get(name, (0, 0))
            # What the stream's own segments do not hold: before them (a fork's inherited records,
            # or what retention removed) and after them (not tiered yet).
            for lo, hi in ((0, first), (end, tail)):
                if lo < hi and self.bounds.offsets.overlaps(format_offset(lo), format_offset(hi), most_open=True):
                    out.append(HotPartition(name, lo, hi))
        return out

    def read(self, partition: sds.InputPartition) -> Iterator[pa.RecordBatch | tuple[Any, ...]]:
        if isinstance(partition, HotPartition):
            yield from self._read_hot(partition)
            return
        # Anything else is Spark's stand-in partition for an empty plan.
        segments = partition.segments if isinstance(partition, SegmentGroup) else []
        for seg in segments:
            batches = read_segment(self._segment(seg.key), self.bounds, self.arrow_schema)
            if self.opts.arrow:
                yield from batches
            else:  # the row-by-row path Spark falls back to, kept to measure what Arrow saves
                yield from (tuple(row.values()) for batch in batches for row in batch.to_pylist())

    def _segment(self, key: str) -> bytes:
        return segment_bytes(self.opts, key)

    def _read_hot(self, part: HotPartition) -> Iterator[pa.RecordBatch]:
        assert self.opts.server is not None
        # Records appended after planning belong to the next read.
        bounds = replace(self.bounds, offsets=self.bounds.offsets.below(format_offset(part.hi), True))
        from_segments = functools.partial(segments_between, self.opts)
        hot = read_range(self.opts.server, self.opts.bucket, part.stream, part.lo, part.hi, from_segments)
        for table in hot:
            yield from restrict(table, bounds, self.arrow_schema)


class RillDataSource(sds.DataSource):
    """`spark.read.format("rill").option("store", …).option("bucket", …).load()`."""

    def __init__(self, options: MutableMapping[str, str]) -> None:
        super().__init__(options)
        self.streaming = {k for k in options if k.lower() in STREAM_ONLY}

    @functools.cached_property
    def read_options(self) -> ReadOptions:
        """A read's options, checked at load() (by `schema`) with the option's name; a streaming read
        checks its own ones too. Writes have options of their own (app/pipeline/sink.py)."""
        return ReadOptions.parse({k: v for k, v in self.options.items() if k not in self.streaming})

    @classmethod
    def name(cls) -> str:
        return "rill"

    def schema(self) -> StructType:
        value = self.read_options.json_schema
        return SPARK_SCHEMA if value is None else StructType([*SPARK_SCHEMA.fields, StructField(VALUE, value)])

    def reader(self, schema: StructType) -> sds.DataSourceReader:
        if self.streaming:
            raise ValueError(f"option(s) {sorted(self.streaming)} apply to spark.readStream only")
        return RillReader(self.read_options, schema)

    def writer(self, schema: StructType, overwrite: bool) -> sds.DataSourceWriter:
        from app.pipeline.sink import RillWriter, SinkOptions

        if overwrite:
            raise ValueError("streams are append-only: write with mode('append')")
        return RillWriter(SinkOptions.parse(self.options, schema))

    def streamWriter(self, schema: StructType, overwrite: bool) -> sds.DataSourceStreamWriter:  # noqa: N802
        from app.pipeline.sink import RillStreamWriter, SinkOptions

        if overwrite:
            raise ValueError("streams are append-only: use outputMode('append')")
        return RillStreamWriter(SinkOptions.parse(self.options, schema))

    def streamReader(self, schema: StructType) -> sds.DataSourceStreamReader:  # noqa: N802 (Spark's name)
        from app.pipeline.streaming import stream_reader

        return stream_reader(self.options, schema)
