"""The `rill` data source against S3 (moto) and a directory: rows, selection, pruning, empty reads, errors."""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from app.domain.offsets import format_offset
from app.pipeline import PUSHDOWN_CONF
from app.pipeline.cold import pick_row_groups
from app.pipeline.datasource import SPARK_SCHEMA, RillReader, SegmentGroup
from app.pipeline.options import ReadOptions
from app.pipeline.planning import plan
from tests.pipeline.conftest import LAYOUT, Cold, Keep, expected, load, rows


def segments(cold: Cold, bucket: str, streams: list[str] | dict[str, list[int]]) -> int:
    return sum(len(cold.manifests[(bucket, s)].segments) for s in streams)


def utc(ms: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC)


def test_register_turns_filter_pushdown_on(spark: SparkSession) -> None:
    assert spark.conf.get(PUSHDOWN_CONF) == "true"


def test_reads_every_record_of_the_bucket(spark: SparkSession, cold: Cold) -> None:
    df = load(spark, cold.opts())
    assert df.columns == SPARK_SCHEMA.names
    # One partition per manifest entry: the orphan segment no manifest lists is not read.
    assert df.rdd.getNumPartitions() == segments(cold, "b1", LAYOUT["b1"]) == 8
    assert rows(df) == expected(cold, "b1", list(LAYOUT["b1"]))
    logs = df.filter(F.col("stream") == "logs/app").orderBy("offset").select("payload").collect()
    assert b"".join(r.payload for r in logs) == cold.payload("b1", "logs/app")


def test_selects_a_stream_a_prefix_or_a_bucket(spark: SparkSession, cold: Cold) -> None:
    cases: list[tuple[dict[str, str], list[str]]] = [
        ({"stream": "logs/app"}, ["logs/app"]),
        ({"prefix": "logs/"}, ["logs/app", "logs/db"]),
        ({"prefix": "logs"}, ["logs/app", "logs/db", "logsx"]),
    ]
    for extra, streams in cases:
        df = load(spark, cold.opts(**extra))
        assert sorted(r.stream for r in df.select("stream").distinct().collect()) == streams, extra
        assert len(plan(cold.opts(**extra))) == df.rdd.getNumPartitions() == segments(cold, "b1", streams)
    assert rows(load(spark, cold.opts("b2"))) == expected(cold, "b2", ["orders"])


def test_pushed_down_filters_prune_segments_and_rows_stay_exact(spark: SparkSession, cold: Cold) -> None:
    df = load(spark, cold.opts())
    orders = cold.records[("b1", "orders")]  # segments of records 0-9, 10-19, 20-29
    x, y = orders[15], orders[17]
    is_orders = F.col("stream") == "orders"
    off, at = F.col("offset"), F.col("append_time")
    cases: list[tuple[Any, int, list[str], Keep]] = [
        (is_orders & (off >= format_offset(x.pos)), 2, ["orders"], lambda r: r.pos >= x.pos),
        (is_orders & (off < format_offset(x.pos)), 2, ["orders"], lambda r: r.pos < x.pos),
        (
            is_orders & (off > format_offset(x.pos)) & (off <= format_offset(y.pos)),
            1,
            ["orders"],
            lambda r: x.pos < r.pos <= y.pos,
        ),
        (is_orders & (at >= utc(orders[25].time)), 1, ["orders"], lambda r: r.time >= orders[25].time),
        (is_orders & (at < utc(orders[10].time)), 1, ["orders"], lambda r: r.time < orders[10].time),
        (F.col("stream").isin("logs/app", "logs/db"), 3, ["logs/app", "logs/db"], lambda r: True),
    ]
    for cond, parts, streams, keep in cases:
        filtered = df.filter(cond)
        assert filtered.rdd.getNumPartitions() == parts, cond
        assert rows(filtered) == expected(cold, "b1", streams, keep), cond
    # A filter on another bucket leaves nothing to plan: Spark's single empty stand-in partition.
    other = df.filter(F.col("bucket") == "b2")
    assert other.rdd.getNumPartitions() == 1
    assert other.count() == 0


def test_offset_and_time_options_prune_and_filter_rows(spark: SparkSession, cold: Cold) -> None:
    orders = cold.records[("b1", "orders")]
    x, y = orders[15], orders[22]
    by_offset = cold.opts(stream="orders", from_offset=format_offset(x.pos), to_offset=format_offset(y.pos))
    assert len(plan(by_offset)) == 2
    assert rows(load(spark, by_offset)) == expected(cold, "b1", ["orders"], lambda r: x.pos <= r.pos < y.pos)

    start = utc(orders[12].time).isoformat()  # 2024-03-02T00:00:02+00:00
    by_time = cold.opts(stream="orders", start_time=start, end_time=str(orders[25].time))
    assert len(plan(by_time)) == 2
    keep: Keep = lambda r: orders[12].time <= r.time < orders[25].time  # noqa: E731
    assert rows(load(spark, by_time)) == expected(cold, "b1", ["orders"], keep)

    big = cold.records[("b1", "big")]
    middle = cold.opts(stream="big", from_offset=format_offset(big[9].pos))
    assert rows(load(spark, middle)) == expected(cold, "b1", ["big"], lambda r: r.pos >= big[9].pos)


def test_row_groups_are_pruned_by_statistics(cold: Cold, monkeypatch: pytest.MonkeyPatch) -> None:
    big = cold.records[("b1", "big")]
    (part,) = plan(cold.opts(stream="big"))
    meta = pq.ParquetFile(pa.BufferReader(cold.store.get(part.key))).metadata
    assert meta.num_row_groups == 4  # records 0-3, 4-7, 8-11, 12-13

    def groups(**extra: str) -> list[int]:
        return pick_row_groups(meta, ReadOptions.parse(cold.opts(**extra)).bounds)

    assert groups() == [0, 1, 2, 3]
    assert groups(from_offset=format_offset(big[9].pos)) == [2, 3]
    assert groups(to_offset=format_offset(big[4].pos)) == [0]  # record 4 starts group 1: excluded
    assert groups(start_time=str(big[12].time)) == [3]

    # The reader decodes only the groups it picked.
    read: list[int] = []
    original = pq.ParquetFile.read_row_group

    def spy(self: pq.ParquetFile, i: int, *args: Any, **kwargs: Any) -> pa.Table:
        read.append(i)
        return original(self, i, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "read_row_group", spy)
    reader = RillReader(ReadOptions.parse(cold.opts(stream="big", from_offset=format_offset(big[9].pos))), SPARK_SCHEMA)
    batches = list(reader.read(SegmentGroup([part])))
    assert read == [2, 3]
    assert [o for b in batches for o in b.column("offset").to_pylist()] == [format_offset(r.pos) for r in big[9:]]


def test_packed_partitions_read_the_same_rows(spark: SparkSession, cold: Cold) -> None:
    options = cold.opts(max_partition_bytes=str(1 << 30), min_partitions="3")
    df = load(spark, options)
    assert df.rdd.getNumPartitions() == 3
    assert rows(df) == expected(cold, "b1", list(LAYOUT["b1"]))


def test_the_row_by_row_path_reads_the_same_rows(spark: SparkSession, file_cold: Cold) -> None:
    options = file_cold.opts(stream="orders")
    assert rows(load(spark, {**options, "arrow": "false"})) == rows(load(spark, options))


def test_missing_data_reads_as_an_empty_frame(spark: SparkSession, cold: Cold) -> None:
    for options in (cold.opts("empty"), cold.opts(stream="nope"), cold.opts(prefix="zzz")):
        assert plan(options) == []
        df = load(spark, options)
        assert df.columns == SPARK_SCHEMA.names
        assert df.count() == 0


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"bucket": "b1"}, "option 'store' is required"),
        ({"store": "file:///tmp"}, "option 'bucket' is required"),
        ({"store": "ftp://host/x", "bucket": "b1"}, "unsupported store URL"),
        ({"store": "file:///tmp", "bucket": "b1", "stream": "a", "prefix": "b"}, "'stream' and 'prefix' are exclusive"),
        (
            {"store": "file:///tmp", "bucket": "b1", "from_offset": "abc"},
            "option 'from_offset' must be an offset token",
        ),
        ({"store": "file:///tmp", "bucket": "b1", "end_time": "yesterday"}, "option 'end_time' must be an ISO 8601"),
        ({"store": "file:///tmp", "bucket": "b1", "strem": "x"}, "unknown rill option(s) ['strem']"),
        ({"store": "file:///tmp", "bucket": "b1", "path_style": "maybe"}, "'path_style' must be true or false"),
        ({"store": "file:///tmp", "bucket": "b1", "min_partitions": "0"}, "'min_partitions' must be a whole number"),
        ({"store": "file:///tmp", "bucket": "b1", "max_partition_bytes": "1e6"}, "'max_partition_bytes' must be"),
        ({"store": "file:///tmp", "bucket": "b1"}, "option 'url' (a Rill server"),
        ({"store": "file:///tmp", "bucket": "b1", "include_hot": "yes"}, "'include_hot' must be true or false"),
        ({"store": "file:///tmp", "bucket": "b1", "include_hot": "false", "arrow": "no"}, "'arrow' must be true"),
        ({"store": "file:///tmp", "bucket": "b1", "url": "127.0.0.1:4437"}, "option 'url' must be a Rill server's"),
    ],
)
def test_bad_options_are_refused(options: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        ReadOptions.parse(options)


def test_bad_options_fail_at_load(spark: SparkSession) -> None:
    with pytest.raises(Exception, match="option 'bucket' is required"):
        spark.read.format("rill").option("store", "file:///tmp").load()
