"""Streaming reads when a stream goes under a query: deleted between planning a micro-batch and
reading it (the batch ends, and so does any replay of it), or deleted and made again shorter (a
tail never moves back: that is data loss, unless the query accepts it). No Spark session: the
reader's own methods, as Spark calls them, against a real `rill serve`."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable

from app.pipeline import hot
from app.pipeline.datasource import SPARK_SCHEMA
from app.pipeline.hot import DataLoss
from app.pipeline.streaming import RillStreamReader, StreamOptions
from tests.moto import MotoS3
from tests.pipeline.live import BUCKET, make_stream, payloads, spark_options
from tests.server import RillProcess


def _reader(moto_s3: MotoS3, node: RillProcess, prefix: str, fail_on_data_loss: bool) -> RillStreamReader:
    options = spark_options(moto_s3, node, prefix=prefix, url=node.url, failOnDataLoss=str(fail_on_data_loss).lower())
    options.pop("stream", None)
    return RillStreamReader(StreamOptions.parse(options), SPARK_SCHEMA)


def _rows(reader: RillStreamReader, start: dict[str, str], end: dict[str, str]) -> list[bytes]:
    return [
        bytes(row["payload"]) for p in reader.partitions(start, end) for b in reader.read(p) for row in b.to_pylist()
    ]


def test_a_stream_deleted_after_its_batch_was_planned_ends_that_batch(moto_s3: MotoS3, node: RillProcess) -> None:
    reader = _reader(moto_s3, node, "gone-", fail_on_data_loss=True)
    start = reader.initialOffset()
    make_stream(node, "gone-a", payloads(3))
    end = reader.latestOffset(start, ReadAllAvailable())
    assert httpx.delete(f"{node.url}/ds/{BUCKET}/gone-a").status_code == 204
    assert _rows(reader, start, end) == []
    assert _rows(reader, start, end) == []  # a replay of the batch finishes too


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_a_stream_made_again_shorter_is_data_loss_or_read_on_from_its_tail(
    moto_s3: MotoS3, node: RillProcess, fail_on_data_loss: bool
) -> None:
    prefix = f"again-{fail_on_data_loss}-"
    reader = _reader(moto_s3, node, prefix, fail_on_data_loss)
    start = reader.initialOffset()
    make_stream(node, f"{prefix}s", payloads(10))
    end = reader.latestOffset(start, ReadAllAvailable())
    assert len(_rows(reader, start, end)) == 10
    assert httpx.delete(f"{node.url}/ds/{BUCKET}/{prefix}s").status_code == 204
    make_stream(node, f"{prefix}s", payloads(2, start=50))
    if fail_on_data_loss:
        with pytest.raises(DataLoss, match="deleted and made again"):
            reader.latestOffset(end, ReadAllAvailable())
        return
    after = reader.latestOffset(end, ReadAllAvailable())  # on from its tail
    assert _rows(reader, end, after) == []
    more = payloads(1, start=60)
    with httpx.Client() as http:
        assert (
            http.post(
                f"{node.url}/ds/{BUCKET}/{prefix}s",
                content=more[0],
                headers={"content-type": "application/octet-stream"},
            ).status_code
            == 204
        )
    later = reader.latestOffset(after, ReadAllAvailable())
    assert _rows(reader, after, later) == more


def test_admitting_a_few_records_reads_only_the_segments_they_are_in(monkeypatch: pytest.MonkeyPatch) -> None:
    """maxRecordsPerTrigger over an evicted backlog: each start comes from a whole segment's object,
    so only as many as the count needs are taken, not the whole evicted run's."""
    monkeypatch.setattr(hot, "_page", lambda *args: hot._Page(tiered=hot.Tiered(0, 100_000, "s")))
    taken: list[int] = []

    def in_segments(holder: str, lo: int, hi: int) -> Iterator[int]:
        for start in range(lo, hi, 100):  # a segment per 10 records of 10 bytes
            taken.append(start)
            yield from range(start, start + 100, 10)

    server = hot.Server("http://127.0.0.1:1")
    assert hot.after_records(server, "b", "s", 0, 3, in_segments) == 30
    assert taken == [0]
