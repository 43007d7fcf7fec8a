"""The `rill` Spark data source: the cold tier's segments and pack slices and the hot tails as a DataFrame.

The Spark classes only: what a read covers is planned in app/pipeline/planning.py (segments and
slices of packs, by the catalog of manifests and pack indexes, and hot ranges), and they are read in
app/pipeline/cold.py, the hot ranges in app/pipeline/hot.py. Everything pickled to executors is plain
data: stores (boto3 clients) are opened in the worker. A partition reads a segment, or every planned
slice of one pack; `max_partition_bytes` packs several into one partition: every Spark task costs
tens of ms, which small segments (sealed at 8 MiB or after a minute) would otherwise drown in.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, MutableMapping
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa
from pyspark.sql import datasource as sds
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema
from pyspark.sql.types import StructField, StructType

from app.domain.offsets import format_offset
from app.pipeline.cold import read_planned, restrict, segments_between
from app.pipeline.hot import list_streams, read_range
from app.pipeline.messages import VALUE, with_ordinal
from app.pipeline.options import STREAM_ONLY, ReadOptions, narrow
from app.pipeline.planning import PlannedSegment, hot_ranges, pack, plan_streams
from app.pipeline.sink import RillStreamWriter, RillWriter, SinkOptions
from app.pipeline.streaming import stream_reader
from app.tiering.segment import SCHEMA, offset_of

# The segments' columns, and each message's place in its append (see app/pipeline/messages.py).
SPARK_SCHEMA: StructType = from_arrow_schema(with_ordinal(SCHEMA))


@dataclass
class SegmentGroup(sds.InputPartition):
    """What one Spark task reads: segments, and slices of packs (a pack's together; see `planning.pack`)."""

    segments: list[PlannedSegment]


@dataclass
class HotPartition(sds.InputPartition):
    """A range of a stream its own segments do not hold (see `hot_ranges`), read from the server."""

    stream: str
    lo: int
    hi: int


def _as_the_server_has_them(
    segments: list[PlannedSegment], spans: dict[str, tuple[int, int]], live: dict[str, tuple[int, int]]
) -> tuple[list[PlannedSegment], dict[str, tuple[int, int]]]:
    """The planned entries of the streams the server lists, from where retention keeps them: a deleted
    stream's entries stay in the catalog while forks read through them, and a segment may hold records
    retention removed since."""
    kept = []
    for s in segments:
        if s.stream not in live:
            continue
        first = live[s.stream][0]
        if offset_of(s.next_offset) <= first:
            continue
        kept.append(replace(s, keep_from=format_offset(first)) if offset_of(s.first_offset) < first else s)
    return kept, {name: span for name, span in spans.items() if name in live}


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
        # The tails first: a segment or slice tiered after the listing then shows up in the catalog
        # too, and its records are read from it rather than skipped.
        live = {} if opts.server is None else list_streams(opts.server, opts.bucket, opts.stream, opts.prefix)
        segments, spans = plan_streams(opts, self.bounds)
        if opts.server is not None:
            segments, spans = _as_the_server_has_them(segments, spans, live)
        runs = pack(segments, opts.max_partition_bytes, opts.min_partitions)
        tails = {name: tail for name, (_, tail) in live.items()}
        hot = [(name, max(lo, live[name][0]), hi) for name, lo, hi in hot_ranges(tails, spans, self.bounds)]
        hot = [(name, lo, hi) for name, lo, hi in hot if lo < hi]
        return [*(SegmentGroup(run) for run in runs), *(HotPartition(*where) for where in hot)]

    def read(self, partition: sds.InputPartition) -> Iterator[pa.RecordBatch | tuple[Any, ...]]:
        if isinstance(partition, HotPartition):
            yield from self._read_hot(partition)
            return
        # Anything else is Spark's stand-in partition for an empty plan.
        segments = partition.segments if isinstance(partition, SegmentGroup) else []
        batches = read_planned(self.opts, segments, self.bounds, self.arrow_schema)
        if self.opts.arrow:
            yield from batches
        else:  # the row-by-row path Spark falls back to, kept to measure what Arrow saves
            yield from (tuple(row.values()) for batch in batches for row in batch.to_pylist())

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
        if overwrite:
            raise ValueError("streams are append-only: write with mode('append')")
        return RillWriter(SinkOptions.parse(self.options, schema))

    def streamWriter(self, schema: StructType, overwrite: bool) -> sds.DataSourceStreamWriter:  # noqa: N802
        if overwrite:
            raise ValueError("streams are append-only: use outputMode('append')")
        return RillStreamWriter(SinkOptions.parse(self.options, schema))

    def streamReader(self, schema: StructType) -> sds.DataSourceStreamReader:  # noqa: N802 (Spark's name)
        return stream_reader(self.options, schema)
