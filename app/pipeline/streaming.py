"""`spark.readStream.format("rill")`: a Structured Streaming source over the streams of a bucket.

Offsets are per stream, in the protocol's own tokens: `{"orders": "0000000000000000_0000000000004127"}`.
A micro-batch reads, for each stream, the appends that *start* in [its start offset, its end offset),
so every append is read exactly once. Ends are where appends start (or the tail): an end inside an
append would start the next batch at a position retention may remove along with that append.
`latestOffset` takes each stream's tail from the server's listing, so streams created later under
the prefix join (from their start). `maxBytesPerTrigger` cuts each batch to about that many bytes;
`maxRecordsPerTrigger` to that many appends (the server counts them, or the segments' offsets where
it has evicted them), shared evenly between the streams with data. Each partition reads its range
from the server's records route, and from the object store's segments for whatever is tiered and
evicted (`app/pipeline/hot.py`), so hot and cold data read alike and any node serves it. Partitions
are pure functions of their offsets: a batch replayed after a restart from the checkpoint reads the
same rows.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, replace

import pyarrow as pa
from pyspark.sql import datasource as sds
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from app.domain.offsets import format_offset
from app.pipeline.cold import restrict, segments_between, starts_between
from app.pipeline.hot import DataLoss, after_records, earliest, list_tails, next_start, read_range
from app.pipeline.options import STREAM_ONLY, TOKEN, Bounds, Range, ReadOptions
from app.tiering.segment import offset_of

EARLIEST, LATEST = "earliest", "latest"


@dataclass(frozen=True)
class StreamOptions:
    read: ReadOptions
    starting: str | dict[str, str]  # earliest, latest, or a token (or earliest/latest) per stream
    max_bytes: int = 0  # per micro-batch, over all streams; 0: no limit
    fail_on_data_loss: bool = True
    max_records: int = 0  # appends per micro-batch, over all streams; 0: no limit

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> StreamOptions:
        opts = {k.lower(): v for k, v in options.items()}
        read = ReadOptions.parse({k: v for k, v in opts.items() if k not in STREAM_ONLY})
        if read.server is None:
            raise ValueError("a streaming read needs option 'url' (a Rill server): it follows the streams' tails")
        starting = _starting(opts.get("startingoffsets", EARLIEST))
        max_bytes, max_records = (_whole(opts, name) for name in ("maxBytesPerTrigger", "maxRecordsPerTrigger"))
        if max_bytes and max_records:
            raise ValueError("options 'maxBytesPerTrigger' and 'maxRecordsPerTrigger' are exclusive: use one")
        fail = opts.get("failondataloss", "true").strip().lower()
        if fail not in ("true", "false"):
            raise ValueError(f"option 'failOnDataLoss' must be true or false, not {fail!r}")
        return cls(read, starting, max_bytes, fail == "true", max_records)


def _whole(opts: Mapping[str, str], name: str) -> int:
    value = opts.get(name.lower(), "0").strip()
    if not value.isdigit():
        raise ValueError(f"option {name!r} must be a whole number, not {value!r}")
    return int(value)


def _starting(value: str) -> str | dict[str, str]:
    value = value.strip()
    if value in (EARLIEST, LATEST):
        return value
    try:
        given = json.loads(value)
    except ValueError:
        given = None
    if not isinstance(given, dict) or not all(isinstance(v, str) for v in given.values()):
        raise ValueError(
            "option 'startingOffsets' must be earliest, latest, or a JSON object of stream name to offset "
            f'token, earliest or latest (e.g. {{"orders": "0000000000000000_0000000000000042"}}), not {value!r}'
        )
    for name, token in given.items():
        if token not in (EARLIEST, LATEST) and not TOKEN.fullmatch(token):
            raise ValueError(f"startingOffsets for {name!r} is not an offset token: {token!r}")
    return given


def admit(start: dict[str, int], end: dict[str, int], max_bytes: int) -> dict[str, int]:
    """`end` cut so that the streams together advance about `max_bytes`, shared evenly between them."""
    out = dict(start)
    out.update({name: pos for name, pos in end.items() if pos < start.get(name, 0)})  # made again: from its tail
    pending = {name: end[name] - start.get(name, 0) for name in sorted(end) if end[name] > start.get(name, 0)}
    budget = max_bytes
    while pending and budget > 0:
        share = max(1, budget // len(pending))
        for name in list(pending):
            take = min(pending[name], share, budget)
            out[name] = out.get(name, 0) + take
            pending[name] -= take
            budget -= take
            if not pending[name]:
                del pending[name]
            if not budget:
                break
    return out


@dataclass
class StreamRange(sds.InputPartition):
    stream: str
    lo: int
    hi: int
    new: bool = False  # the stream appeared after the batch's start offsets were taken


class RillStreamReader(sds.DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, opts: StreamOptions, schema: StructType) -> None:
        self.opts = opts
        self.arrow_schema = to_arrow_schema(schema, timezone="UTC")
        self._target: dict[str, int] | None = None  # Trigger.AvailableNow: the tails when the query started
        self._turn = 0  # where admission by records starts among the streams with data

    def _tails(self) -> dict[str, int]:
        read = self.opts.read
        assert read.server is not None
        return list_tails(read.server, read.bucket, read.stream, read.prefix)

    def initialOffset(self) -> dict[str, str]:  # noqa: N802 (Spark's names)
        starting, read = self.opts.starting, self.opts.read
        assert read.server is not None
        tails = self._tails()
        given = {name: starting if isinstance(starting, str) else starting.get(name, EARLIEST) for name in tails}
        first = earliest(read.server, read.bucket, [name for name, where in given.items() if where == EARLIEST])
        start: dict[str, int] = {}
        for name, tail in tails.items():
            where = given[name]
            start[name] = tail if where == LATEST else first.get(name, 0) if where == EARLIEST else offset_of(where)
        return _tokens(start)

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802
        if self.opts.max_records:
            return ReadMaxRows(self.opts.max_records)
        return ReadMaxBytes(self.opts.max_bytes) if self.opts.max_bytes else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802
        self._target = self._tails()

    def latestOffset(self, start: dict[str, str], limit: ReadLimit) -> dict[str, str]:  # noqa: N802
        positions = _positions(start)
        tails = self._target if self._target is not None else self._tails()
        for name, tail in tails.items():
            if tail < positions.get(name, 0) and self.opts.fail_on_data_loss:
                # A tail never moves back: the stream was deleted and made again under its name.
                raise DataLoss(
                    f"{self.opts.read.bucket}/{name} ends at {format_offset(tail)}, before the "
                    f"{format_offset(positions[name])} already read: it was deleted and made again "
                    "(failOnDataLoss=false reads it on from its tail)"
                )
        # A stream that has gone keeps its offset; one that is new is read from its start, and one
        # made again on from its tail.
        end = {**positions, **tails}
        if isinstance(limit, ReadMaxBytes):
            end = self._at_appends(positions, admit(positions, end, limit.max_bytes), end)
        elif isinstance(limit, ReadMaxRows):
            end = self._admit_records(positions, end, limit.max_rows)
        return _tokens(end)

    def _at_appends(self, start: dict[str, int], cut: dict[str, int], end: dict[str, int]) -> dict[str, int]:
        """`cut` moved on to where appends start: a batch that ended inside an append would begin the
        next one at a position retention may remove with that append, which would read as lost."""
        read = self.opts.read
        assert read.server is not None
        out = dict(cut)
        for name, pos in cut.items():
            if start.get(name, 0) < pos < end[name]:
                in_segments = functools.partial(starts_between, read)
                out[name] = min(end[name], next_start(read.server, read.bucket, name, pos, in_segments))
        return out

    def _admit_records(self, start: dict[str, int], end: dict[str, int], most: int) -> dict[str, int]:
        """`end` cut to about `most` appends in all, shared evenly between the streams with any."""
        read = self.opts.read
        assert read.server is not None
        pending = [name for name in sorted(end) if end[name] > start.get(name, 0)]
        if len(pending) > most:  # fewer appends than streams: a different few go first each time
            self._turn = (self._turn + most) % len(pending)
            pending = pending[self._turn :] + pending[: self._turn]
        share = max(1, most // max(1, len(pending)))
        out = dict(end)
        for name in pending[: max(1, most)]:
            lo = start.get(name, 0)
            in_segments = functools.partial(starts_between, read)
            out[name] = min(end[name], after_records(read.server, read.bucket, name, lo, share, in_segments))
        for name in pending[max(1, most) :]:  # more streams than appends allowed: these wait
            out[name] = start.get(name, 0)
        return out

    def partitions(self, start: dict[str, str], end: dict[str, str]) -> Sequence[sds.InputPartition]:
        lo = _positions(start)
        # A stream that is new since `start` is read from wherever its history now begins.
        return [
            StreamRange(name, lo.get(name, 0), hi, name not in lo)
            for name, hi in sorted(_positions(end).items())
            if hi > lo.get(name, 0)
        ]

    def read(self, partition: sds.InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, StreamRange)
        read = self.opts.read
        assert read.server is not None
        lo, hi = format_offset(partition.lo), format_offset(partition.hi)
        bounds = replace(Bounds(), offsets=Range(lo, False, hi, True))
        from_segments = functools.partial(segments_between, read)
        lossless = self.opts.fail_on_data_loss and not partition.new
        name = partition.stream
        for table in read_range(read.server, read.bucket, name, partition.lo, partition.hi, from_segments, lossless):
            yield from restrict(table, bounds, self.arrow_schema)

    def commit(self, end: dict[str, str]) -> None:
        pass  # nothing is held per batch: the server keeps every record until retention


def _positions(offsets: dict[str, str]) -> dict[str, int]:
    return {name: offset_of(token) for name, token in offsets.items()}


def _tokens(positions: dict[str, int]) -> dict[str, str]:
    return {name: format_offset(pos) for name, pos in sorted(positions.items())}


def stream_reader(options: MutableMapping[str, str], schema: StructType) -> RillStreamReader:
    return RillStreamReader(StreamOptions.parse(options), schema)
