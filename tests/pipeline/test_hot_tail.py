"""Batch reads with the hot tail: a real `rill serve` tiering to moto's S3 server, read by Spark."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pytest

from app.domain.offsets import format_offset
from app.pipeline.hot import Server, read_range
from app.security.tokens import toml_entry
from app.tiering.segment import offset_of
from tests.moto import MotoS3
from tests.pipeline.live import BUCKET, OCTET, PREFIX, make_stream, payloads, read_http, spark_options, wait_for_tiering
from tests.server import RillProcess


def test_a_batch_read_right_after_appends_sees_them_across_the_tiered_boundary(
    spark: Any, moto_s3: MotoS3, node: RillProcess
) -> None:
    written = payloads(100)
    url = make_stream(node, "orders", written)
    boundary = wait_for_tiering(moto_s3, "orders", 4096)
    later = payloads(7, start=100)
    with httpx.Client() as http:
        for payload in later:
            assert http.post(url, content=payload, headers=OCTET).status_code in (200, 204)
    written += later
    tail = sum(map(len, written))
    assert 0 < boundary < tail  # some rows come from segments, the rest from the server

    rows = (
        spark.read.format("rill")
        .options(**spark_options(moto_s3, node, stream="orders"))
        .load()
        .select("offset", "next_offset", "payload", "producer_id")
        .orderBy("offset")
        .collect()
    )
    assert [bytes(r["payload"]) for r in rows] == written  # one row per append, none twice, none missing
    assert rows[0]["offset"] == format_offset(0) and rows[-1]["next_offset"] == format_offset(tail)
    assert all(a["next_offset"] == b["offset"] for a, b in zip(rows, rows[1:], strict=False))
    assert b"".join(bytes(r["payload"]) for r in rows) == read_http(url)
    assert any(offset_of(r["offset"]) == boundary for r in rows)


def test_offsets_and_streams_filter_the_hot_part_too(spark: Any, moto_s3: MotoS3, node: RillProcess) -> None:
    written = payloads(60)
    make_stream(node, "filtered", written)
    boundary = wait_for_tiering(moto_s3, "filtered", 4096)
    starts = [sum(map(len, written[:i])) for i in range(len(written))]
    cut = next(s for s in starts if s > boundary)  # a record in the hot part
    df = spark.read.format("rill").options(**spark_options(moto_s3, node, prefix="filt")).load()
    got = df.where(df["offset"] >= format_offset(cut)).select("payload").orderBy("offset").collect()
    assert [bytes(r["payload"]) for r in got] == written[starts.index(cut) :]
    assert df.where(df["stream"] == "other").count() == 0
    cold_only = spark_options(moto_s3, node, stream="filtered", include_hot="false")
    assert spark.read.format("rill").options(**cold_only).load().count() == sum(s < boundary for s in starts)


def test_a_missing_bucket_or_stream_is_an_error_not_an_empty_frame(
    spark: Any, moto_s3: MotoS3, node: RillProcess
) -> None:
    cases = (({"bucket": "nosuchbucket"}, "bucket_not_found|404"), ({"stream": "nope"}, "does not exist"))
    for extra, message in cases:
        df = spark.read.format("rill").options(**spark_options(moto_s3, node, **extra)).load()
        with pytest.raises(Exception, match=message):
            df.count()


def test_the_records_route_serves_local_records_and_sends_evicted_ones_to_the_segments(
    moto_s3: MotoS3, node: RillProcess
) -> None:
    written = payloads(70)
    url = make_stream(node, "routed", written)
    boundary = wait_for_tiering(moto_s3, "routed", 4096)
    with httpx.Client() as http:
        moved = http.get(url + "/__ds/records", params={"offset": "-1"})
        assert moved.status_code == 409 and moved.json()["error"]["code"] == "records_tiered"
        evicted = offset_of(moved.headers["stream-tiered-offset"])
        assert 0 < evicted <= boundary
        local = http.get(url + "/__ds/records", params={"offset": format_offset(evicted)})
        assert local.status_code == 200 and local.headers["stream-up-to-date"] == "true"
        assert local.headers["content-type"] == "application/vnd.apache.arrow.stream"
        table = pa.ipc.open_stream(local.content).read_all()
        assert table["payload"].to_pylist() == written[-table.num_rows :]
        assert table["offset"][0].as_py() == format_offset(evicted)
        assert http.head(url + "/__ds/records", params={"offset": format_offset(evicted)}).status_code == 200
        two = http.get(url + "/__ds/records", params={"offset": format_offset(evicted), "limit": "2"})
        assert pa.ipc.open_stream(two.content).read_all().num_rows == 2 and "stream-up-to-date" not in two.headers
        assert two.headers["stream-next-offset"] == table["offset"][2].as_py()
        for bad in ("0", "x", "100001"):
            refused = http.get(url + "/__ds/records", params={"offset": format_offset(evicted), "limit": bad})
            assert refused.status_code == 400 and refused.json()["error"]["code"] == "invalid_limit"
        inside = http.get(url + "/__ds/records", params={"offset": format_offset(evicted + 1)})
        after = pa.ipc.open_stream(inside.content).read_all()  # the appends that start after it
        assert after["offset"].to_pylist() == table["offset"].to_pylist()[1:]
        beyond = http.get(url + "/__ds/records", params={"offset": format_offset(sum(map(len, written)) + 1)})
        assert beyond.status_code == 400 and beyond.json()["error"]["code"] == "offset_out_of_range"
        assert http.get(f"{node.url}/ds/{BUCKET}/missing/__ds/records").status_code == 404
        assert http.post(url + "/__ds/records", content=b"x").status_code == 405

    # A reader planned before the eviction: what moved is asked of the segments, the rest of the server.
    asked: list[tuple[int, int]] = []

    def from_segments(holder: str, lo: int, hi: int) -> Iterator[pa.Table]:
        assert holder == "routed"
        asked.append((lo, hi))
        return iter(())

    tail = sum(map(len, written))
    tables = list(read_range(Server(node.url), BUCKET, "routed", 0, tail, from_segments))
    assert asked == [(0, evicted)]
    assert offset_of(tables[0]["offset"][0].as_py()) == evicted
    # Planning refuses a stream that does not exist (above); one gone since the batch was planned has
    # nothing more to read, and the batch (and any replay of it) ends.
    assert list(read_range(Server(node.url), BUCKET, "missing", 0, 10, from_segments)) == []


def test_export_reads_the_hot_tail_with_url(tmp_path: Path, moto_s3: MotoS3, node: RillProcess) -> None:
    from app.pipeline.cli import read_options

    class Args:
        store, bucket, stream, prefix = f"s3://{moto_s3.bucket}/{PREFIX}", BUCKET, "orders", None
        s3_endpoint_url, region, path_style = moto_s3.endpoint_url, "us-east-1", "true"
        from_offset = to_offset = start_time = end_time = None
        url, token, max_partition_mb = node.url, "t0k", 0.0

    options = read_options(Args())  # type: ignore[arg-type]
    assert options["include_hot"] == "true" and options["url"] == node.url and options["token"] == "t0k"
    Args.url = None
    assert read_options(Args())["include_hot"] == "false"  # type: ignore[arg-type]


def test_json_streams_read_as_a_row_per_message_with_a_parsed_value(
    spark: Any, moto_s3: MotoS3, node: RillProcess
) -> None:
    url = f"{node.url}/ds/{BUCKET}/messages"
    json_type = {"content-type": "application/json"}
    assert httpx.put(url, headers=json_type).status_code == 201
    appends = [[{"id": i, "tag": f"t{i}", "pad": "x" * 80}, {"id": -i}] for i in range(60)] + [[7, "text", {"id": "x"}]]
    with httpx.Client() as http:
        for messages in appends:
            assert http.post(url, json=messages, headers=json_type).status_code in (200, 204)
    wait_for_tiering(moto_s3, "messages", 4096)  # some appends are read from segments, the rest from the server
    options = spark_options(moto_s3, node, stream="messages", json_schema="id INT, tag STRING")
    df = spark.read.format("rill").options(**options).load()
    assert df.columns[:5] == ["bucket", "stream", "offset", "next_offset", "ordinal"] and df.columns[-1] == "value"
    rows = df.orderBy("offset", "ordinal").collect()
    flat = [m for messages in appends for m in messages]
    assert [json.loads(bytes(r["payload"])) for r in rows] == flat
    assert [r["ordinal"] for r in rows] == [i for messages in appends for i in range(len(messages))]
    assert rows[0]["value"].asDict() == {"id": 0, "tag": "t0"} and rows[3]["value"].asDict() == {"id": -1, "tag": None}
    assert [r["value"] for r in rows[-3:]] == [None, None, None]  # not objects, or not of the schema
    first = [r for r in rows if r["offset"] == rows[0]["offset"]]
    assert len(first) == 2 and {r["next_offset"] for r in first} == {rows[2]["offset"]}
    with pytest.raises(Exception, match="not a DDL schema"):
        spark.read.format("rill").options(**{**options, "json_schema": "id WHATEVER"}).load()


def test_the_token_option_reads_a_server_with_access_control(spark: Any, tmp_path: Path) -> None:
    reader, admin = "spark-reader-token", "spark-admin-token"
    config = tmp_path / "rill.toml"
    config.write_text('[auth]\nmode = "on"\n\n' + toml_entry(reader, ["read:*"]) + toml_entry(admin, ["admin:*"]))
    server = RillProcess(tmp_path / "data", None, "--config", str(config)).start()
    try:
        root = {"authorization": f"Bearer {admin}"}
        with httpx.Client(base_url=server.url, headers=root) as http:
            assert http.put("/ds/secure").status_code == 201
            assert http.put("/ds/secure/s", headers=OCTET).status_code == 201
            for payload in (b"one", b"two"):
                assert http.post("/ds/secure/s", content=payload, headers=OCTET).status_code in (200, 204)
        options = {"store": (tmp_path / "data" / "cold").as_uri(), "url": server.url, "bucket": "secure"}
        df = spark.read.format("rill").options(**options, token=reader).load()
        assert [bytes(r["payload"]) for r in df.orderBy("offset").collect()] == [b"one", b"two"]
        with pytest.raises(Exception, match="401"):
            spark.read.format("rill").options(**options).load().count()
    finally:
        server.stop()


def test_a_fork_reads_what_it_inherited_from_its_sources_segments(
    spark: Any, moto_s3: MotoS3, node: RillProcess
) -> None:
    source = payloads(70, start=3000)
    make_stream(node, "fk-src", source)
    boundary = wait_for_tiering(moto_s3, "fk-src", 4096)  # evicted at once: only its segments have them
    starts = [sum(map(len, source[:i])) for i in range(len(source))]
    cut = next(i for i, s in enumerate(starts) if s > boundary // 2)
    fork = f"{node.url}/ds/{BUCKET}/fk-fork"
    headers = {**OCTET, "stream-forked-from": f"/ds/{BUCKET}/fk-src", "stream-fork-offset": format_offset(starts[cut])}
    assert httpx.put(fork, headers=headers).status_code == 201
    own = payloads(5, start=4000)
    with httpx.Client() as http:
        for payload in own:
            assert http.post(fork, content=payload, headers=OCTET).status_code in (200, 204)
    df = spark.read.format("rill").options(**spark_options(moto_s3, node, stream="fk-fork")).load()
    rows = df.orderBy("offset").collect()
    assert [bytes(r["payload"]) for r in rows] == source[:cut] + own
    assert {r["stream"] for r in rows} == {"fk-fork"}
    assert b"".join(bytes(r["payload"]) for r in rows) == read_http(fork)


def test_a_read_holds_what_the_server_serves_not_a_deleted_source_nor_what_retention_removed(
    spark: Any, moto_s3: MotoS3, node: RillProcess
) -> None:
    """A deleted stream's segments stay in the store while a fork reads them, and a segment may hold
    records retention removed since: a read with a server returned both (the deleted source's rows
    in a prefix read, the trimmed records of a stream), which the server serves neither of."""
    source = payloads(70, start=5000)
    source_url = make_stream(node, "rtd-src", source)
    wait_for_tiering(moto_s3, "rtd-src", 4096)
    starts = [sum(map(len, source[:i])) for i in range(len(source))]
    headers = {**OCTET, "stream-forked-from": f"/ds/{BUCKET}/rtd-src", "stream-fork-offset": format_offset(starts[10])}
    assert httpx.put(f"{node.url}/ds/{BUCKET}/rtd-fork", headers=headers).status_code == 201
    assert httpx.delete(source_url).status_code == 204
    df = spark.read.format("rill").options(**spark_options(moto_s3, node, prefix="rtd-")).load()
    got = df.orderBy("stream", "offset").collect()
    assert {r["stream"] for r in got} == {"rtd-fork"}
    assert [bytes(r["payload"]) for r in got] == source[:10]

    kept = payloads(70, start=6000)
    url = make_stream(node, "rtt-trimmed", kept)
    wait_for_tiering(moto_s3, "rtt-trimmed", 4096)
    cut = sum(map(len, kept[:3]))  # inside the first segment
    assert httpx.put(f"{url}/retention/{format_offset(cut)}").status_code == 204
    df = spark.read.format("rill").options(**spark_options(moto_s3, node, stream="rtt-trimmed")).load()
    got = df.orderBy("offset").collect()
    assert [bytes(r["payload"]) for r in got] == kept[3:]
    assert b"".join(bytes(r["payload"]) for r in got) == read_http(url)
