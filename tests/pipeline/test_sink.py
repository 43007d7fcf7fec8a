"""The rill sink: batch and streaming writes to a real server, each row appended once."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from pyspark.sql.types import BinaryType, StringType, StructField, StructType

from app.pipeline.sink import SinkOptions, _Producer
from tests.moto import MotoS3
from tests.pipeline.live import BUCKET, OCTET, make_stream, payloads, read_http, spark_options
from tests.server import RillProcess


def sink_options(node: RillProcess, **extra: str) -> dict[str, str]:
    return {"url": node.url, "bucket": BUCKET, **extra}


def test_a_batch_write_appends_each_row_once_and_a_retried_task_adds_nothing(spark: Any, node: RillProcess) -> None:
    for name in ("sink-a", "sink-b"):
        make_stream(node, name, [])
    rows = [(f"sink-{'ab'[i % 2]}", f"row-{i}".encode()) for i in range(40)]
    df = spark.createDataFrame(rows, "stream STRING, payload BINARY").repartition(3)
    df.write.format("rill").options(**sink_options(node)).mode("append").save()
    for name in ("sink-a", "sink-b"):
        got = read_http(f"{node.url}/ds/{BUCKET}/{name}")
        want = sorted(p for s, p in rows if s == name)
        assert len(got) == sum(map(len, want))  # every row once (tasks interleave, so order is per task)
        assert sorted(got.replace(b"row-", b" row-").split()) == want

    # A task that runs again (a retry, or a zombie attempt) sends the same producer, epoch and seqs.
    opts = SinkOptions.parse(sink_options(node, stream="sink-c"), StructType([StructField("payload", BinaryType())]))
    make_stream(node, "sink-c", [])
    first = [("sink-c", b"x%d;" % i) for i in range(10)]
    _Producer(opts, "spark-job-0", 0).append_all(iter(first[:6]))  # the first attempt dies after six rows
    _Producer(opts, "spark-job-0", 0).append_all(iter(first))
    assert read_http(f"{node.url}/ds/{BUCKET}/sink-c") == b"".join(p for _, p in first)


def test_a_named_job_run_again_appends_nothing_twice(spark: Any, node: RillProcess) -> None:
    """Each batch write used to name a new job, so a failed write run again appended its rows again."""
    make_stream(node, "sink-job", [])
    rows = [(f"row-{i};".encode(),) for i in range(30)]
    df = spark.createDataFrame(rows, "payload BINARY").coalesce(1)
    for _ in range(2):
        df.write.format("rill").options(**sink_options(node, stream="sink-job", job="copy-1")).mode("append").save()
    assert read_http(f"{node.url}/ds/{BUCKET}/sink-job") == b"".join(p for (p,) in rows)
    df.write.format("rill").options(**sink_options(node, stream="sink-job", job="copy-2")).mode("append").save()
    assert read_http(f"{node.url}/ds/{BUCKET}/sink-job") == b"".join(p for (p,) in rows) * 2  # another job


def test_a_streaming_write_copies_a_json_stream_message_by_message(
    spark: Any, moto_s3: MotoS3, node: RillProcess, tmp_path: Any
) -> None:
    json_type = {"content-type": "application/json"}
    source, target = f"{node.url}/ds/{BUCKET}/copy-from", f"{node.url}/ds/{BUCKET}/copy-to"
    for url in (source, target):
        assert httpx.put(url, headers=json_type).status_code == 201
    messages = [{"n": i, "list": [i, i + 1]} for i in range(25)]
    for i in range(0, 25, 5):
        assert httpx.post(source, json=messages[i : i + 5], headers=json_type).status_code in (200, 204)
    stream = spark.readStream.format("rill").options(**spark_options(moto_s3, node, stream="copy-from")).load()
    query = (
        stream.select("payload")
        .writeStream.format("rill")
        .options(**sink_options(node, stream="copy-to"))
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(90)
    assert json.loads(read_http(target)) == messages  # one append a message, arrays kept whole


@pytest.mark.parametrize(
    ("options", "schema", "message"),
    [
        ({"bucket": "b"}, "payload BINARY", "needs option 'url'"),
        ({"url": "http://h", "bucket": "b/c"}, "payload BINARY", "may not contain '/'"),
        ({"url": "http://h", "bucket": "b"}, "payload BINARY", "needs option 'stream' or a 'stream' column"),
        ({"url": "http://h", "bucket": "b", "stream": "s"}, "body BINARY", "a 'payload' column"),
        ({"url": "http://h", "bucket": "b", "strem": "s"}, "payload BINARY", "unknown rill sink option"),
        ({"url": "http://h", "bucket": "b", "stream": "s", "job": "a b"}, "payload BINARY", "option 'job'"),
    ],
)
def test_bad_sink_options_are_refused(options: dict[str, str], schema: str, message: str) -> None:
    name, kind = schema.split()
    struct = StructType([StructField(name, BinaryType() if kind == "BINARY" else StringType())])
    with pytest.raises(ValueError, match=message):
        SinkOptions.parse(options, struct)


def test_writing_to_a_missing_stream_fails_clearly(spark: Any, node: RillProcess) -> None:
    df = spark.createDataFrame([(b"x",)], "payload BINARY")
    with pytest.raises(Exception, match="stream_not_found|404"):
        df.write.format("rill").options(**sink_options(node, stream="nowhere")).mode("append").save()
    with pytest.raises(Exception, match="append-only"):
        df.write.format("rill").options(**sink_options(node, stream="nowhere")).mode("overwrite").save()
    make_stream(node, "sink-text", [])
    spark.createDataFrame([("hé",)], "payload STRING").write.format("rill").options(
        **sink_options(node, stream="sink-text")
    ).mode("append").save()
    assert read_http(f"{node.url}/ds/{BUCKET}/sink-text") == "hé".encode()
    assert OCTET and payloads(1)  # the shared helpers stay in use
