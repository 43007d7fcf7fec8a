"""Structured Streaming over a real server and moto's S3: restarts from a checkpoint, AvailableNow,
admission control, new streams under a prefix, retention and failOnDataLoss."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.domain.offsets import format_offset
from app.pipeline.streaming import StreamOptions, admit
from tests.moto import MotoS3
from tests.pipeline.live import OCTET, make_stream, payloads, read_http, spark_options, wait_for_tiering
from tests.server import RillProcess


def written_rows(path: Path, spark: Any) -> dict[str, list[tuple[str, bytes]]]:
    """(offset, payload) of every row the query wrote, by stream, in the order of offsets."""
    rows = spark.read.parquet(str(path)).select("stream", "offset", "payload").collect()
    out: dict[str, list[tuple[str, bytes]]] = {}
    for row in rows:
        out.setdefault(row["stream"], []).append((row["offset"], bytes(row["payload"])))
    return {name: sorted(pairs) for name, pairs in out.items()}


def available_now(spark: Any, options: dict[str, str], name: str) -> Any:
    """A query over what the streams hold now, into the memory table `name`."""
    stream = spark.readStream.format("rill").options(**options).load()
    return stream.writeStream.format("memory").queryName(name).trigger(availableNow=True).start()


def test_a_query_stopped_midway_resumes_from_its_checkpoint_and_reads_every_record_once(
    spark: Any, moto_s3: MotoS3, node: RillProcess, tmp_path: Path
) -> None:
    written = {"sq-a": payloads(60), "sq-b": payloads(40, start=1000)}
    urls = {name: make_stream(node, name, records) for name, records in written.items()}
    wait_for_tiering(moto_s3, "sq-a", 4096)  # part of it is in the object store only (evicted here)
    stop = threading.Event()

    def keep_appending() -> None:
        i = 0
        with httpx.Client() as http:
            while not stop.is_set() and i < 150:
                name = ("sq-a", "sq-b", "sq-c")[i % 3]
                if name == "sq-c" and name not in urls:  # a stream created while the query runs
                    urls[name] = make_stream(node, name, [])
                    written[name] = []
                payload = f"live-{i}".encode() * 3
                assert http.post(urls[name], content=payload, headers=OCTET).status_code in (200, 204)
                written[name].append(payload)
                i += 1
                time.sleep(0.02)

    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"

    def start() -> Any:
        options = spark_options(moto_s3, node, prefix="sq-", startingOffsets="earliest", maxBytesPerTrigger="2500")
        return (
            spark.readStream.format("rill")
            .options(**options)
            .load()
            .writeStream.format("parquet")
            .option("path", str(out))
            .option("checkpointLocation", str(checkpoint))
            .trigger(processingTime="200 milliseconds")
            .start()
        )

    appender = threading.Thread(target=keep_appending)
    appender.start()
    try:
        query = start()
        deadline = time.monotonic() + 60
        while len(query.recentProgress) < 3:
            assert time.monotonic() < deadline, "the query made no progress"
            time.sleep(0.2)
        query.stop()  # midway: appends go on while it is down
        time.sleep(1.0)
        query = start()
        appender.join(timeout=60)
        query.processAllAvailable()
        query.stop()
    finally:
        stop.set()
        appender.join()
    rows = written_rows(out, spark)
    assert set(rows) == set(written)
    for name, records in written.items():
        assert [payload for _, payload in rows[name]] == records, name  # each once, in order
    assert b"".join(p for _, p in rows["sq-a"]) == read_http(urls["sq-a"])


def test_available_now_reads_hot_and_cold_data_and_stops(spark: Any, moto_s3: MotoS3, node: RillProcess) -> None:
    records = payloads(70, start=5000)
    make_stream(node, "an-x", records)
    wait_for_tiering(moto_s3, "an-x", 4096)
    options = spark_options(moto_s3, node, stream="an-x", maxBytesPerTrigger="1000")
    query = available_now(spark, options, "available_now")
    assert query.awaitTermination(90)
    got = spark.sql("select offset, payload from available_now order by offset").collect()
    assert [bytes(r["payload"]) for r in got] == records
    assert len(query.recentProgress) > 1  # the byte limit split it into several batches
    starts = {format_offset(sum(map(len, records[:i]))) for i in range(len(records) + 1)}
    ends = [p["sources"][0]["endOffset"] for p in query.recentProgress]
    ends = [json.loads(e)["an-x"] if isinstance(e, str) else e["an-x"] for e in ends]
    assert set(ends) <= starts  # every batch ends where an append starts


def test_max_records_per_trigger_admits_that_many_appends_a_batch_from_cold_and_hot(
    spark: Any, moto_s3: MotoS3, node: RillProcess
) -> None:
    first, second = payloads(45, start=7000), payloads(40, start=8000)
    make_stream(node, "mr-a", first)
    make_stream(node, "mr-b", second)
    wait_for_tiering(moto_s3, "mr-a", 4096)  # mr-a's first appends are only in the object store
    query = available_now(spark, spark_options(moto_s3, node, prefix="mr-", maxRecordsPerTrigger="20"), "max_records")
    assert query.awaitTermination(120)
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert max(sizes) <= 20 and sum(sizes) == 85 and len(sizes) >= 5
    got = spark.sql("select stream, payload from max_records order by stream, offset").collect()
    assert [bytes(r["payload"]) for r in got] == first + second


def test_retention_fails_a_query_unless_it_accepts_data_loss(spark: Any, moto_s3: MotoS3, node: RillProcess) -> None:
    records = payloads(30, start=9000)
    url = make_stream(node, "rt-x", records)
    cut = sum(map(len, records[:10]))
    assert httpx.put(f"{url}/retention/{format_offset(cut)}").status_code in (200, 204)
    starting = json.dumps({"rt-x": format_offset(0)})

    def run(name: str, **extra: str) -> Any:
        options = spark_options(moto_s3, node, stream="rt-x", startingOffsets=starting, **extra)
        return available_now(spark, options, name)

    failing = run("rt_strict")
    with pytest.raises(Exception, match="removed by retention"):
        failing.awaitTermination(90)
    lenient = run("rt_lenient", failOnDataLoss="false")
    assert lenient.awaitTermination(90)
    got = spark.sql("select payload from rt_lenient order by offset").collect()
    assert [bytes(r["payload"]) for r in got] == records[10:]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"startingOffsets": "first"}, "'startingOffsets' must be earliest, latest"),
        ({"startingOffsets": '{"a": "12"}'}, "not an offset token"),
        ({"maxBytesPerTrigger": "1 MB"}, "'maxBytesPerTrigger' must be a whole number"),
        ({"maxRecordsPerTrigger": "-1"}, "'maxRecordsPerTrigger' must be a whole number"),
        ({"maxRecordsPerTrigger": "10", "maxBytesPerTrigger": "10"}, "are exclusive"),
        ({"failOnDataLoss": "perhaps"}, "'failOnDataLoss' must be true or false"),
        ({"url": None}, "a streaming read needs option 'url'"),
    ],
)
def test_bad_streaming_options_are_refused(extra: dict[str, str | None], message: str) -> None:
    options = {"store": "file:///tmp", "bucket": "b1", "url": "http://127.0.0.1:1", "include_hot": "true", **extra}
    if options["url"] is None:
        options = {**{k: v for k, v in options.items() if k != "url"}, "include_hot": "false"}
    with pytest.raises(ValueError, match=message):
        StreamOptions.parse({k: v for k, v in options.items() if v is not None})


def test_streaming_options_on_a_batch_read_are_an_error(spark: Any, moto_s3: MotoS3, node: RillProcess) -> None:
    df = spark.read.format("rill").options(**spark_options(moto_s3, node, startingOffsets="earliest")).load()
    with pytest.raises(Exception, match="apply to spark.readStream only"):
        df.count()


def test_admission_shares_the_byte_budget_evenly() -> None:
    assert admit({"a": 0, "b": 0}, {"a": 100, "b": 100}, 50) == {"a": 25, "b": 25}
    assert admit({"a": 0, "b": 90}, {"a": 100, "b": 100}, 50) == {"a": 40, "b": 100}  # b's rest goes to a
    assert admit({"a": 0}, {"a": 100, "new": 10}, 1000) == {"a": 100, "new": 10}
    assert admit({"a": 5}, {"a": 5}, 10) == {"a": 5}
    assert admit({"a": 0, "b": 0, "c": 0}, {"a": 9, "b": 9, "c": 9}, 1) == {"a": 1, "b": 0, "c": 0}
