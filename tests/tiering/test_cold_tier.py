"""The cold tier end to end: real `rill serve` processes tiering to moto's S3 server over HTTP."""

from __future__ import annotations

import base64
import functools
import json
import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.domain.offsets import format_offset
from app.tiering import catalog
from app.tiering.segment import manifest_key, offset_of
from tests.moto import MotoS3
from tests.server import RillCluster, RillProcess
from tests.server import read_to_tail as read_all

AWS_ENV = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}
SMALL_SEGMENTS = ("--segment-max-bytes", "4096", "--segment-max-age", "0.3", "--local-disk-budget", "0")
FREQUENT_BACKUPS = {"RILL_STATE_CHECKPOINT_INTERVAL": "1"}
BUCKET = "cold"
OCTET = {"content-type": "application/octet-stream"}


def cold_args(moto: MotoS3, prefix: str) -> tuple[str, ...]:
    return ("--cold-store", f"s3://{moto.bucket}/{prefix}", "--s3-endpoint-url", moto.endpoint_url)


@pytest.fixture()
def moto() -> Iterator[MotoS3]:
    """A server of this test's own: the outage test stops and starts it."""
    server = MotoS3(BUCKET).start().create_bucket()
    yield server
    server.stop()


def wait_for(predicate: Callable[[], bool], timeout: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def tiering(url: str) -> dict[str, Any]:
    return httpx.get(url + "/healthz", timeout=2).json()["tiering"]  # type: ignore[no-any-return]


def all_tiered(url: str) -> bool:
    status = tiering(url)
    return status["untiered_bytes"] == 0 and status["local_bytes"] == 0


def read_sse(client: httpx.Client, url: str) -> bytes:
    """Data events of an SSE read of a byte stream (base64 events) from the start until up to date."""
    out = b""
    with client.stream("GET", url, params={"offset": "-1", "live": "sse"}, timeout=30) as r:
        assert r.status_code == 200
        event, data = None, []
        for line in r.iter_lines():
            if line.startswith("event:"):
                event = line.split(":", 1)[1].strip()
            elif line.startswith("data:"):
                data.append(line[5:].removeprefix(" "))
            elif line == "" and event:
                if event == "data":
                    out += base64.b64decode("".join(data))
                elif event == "control" and json.loads("\n".join(data)).get("upToDate"):
                    return out
                event, data = None, []
    return out


NAMES = ("alpha", "nested/beta", "gamma")
# Side by side the streams are due together and share packs; alone, alpha seals a segment of its own
# between its packed slices (so it has a manifest naming both), while the others have none.
ROUNDS = (NAMES, ("alpha",), NAMES, NAMES)


def write_streams(
    client: httpx.Client,
    base: str,
    rng: random.Random,
    rounds: tuple[tuple[str, ...], ...] = (NAMES,),
    settle: Callable[[], None] = lambda: None,
) -> dict[str, bytes]:
    """A few byte streams (one with a slash in its name) of random appends, in rounds: the round's
    streams take turns appending, then `settle` runs. Returns what each holds."""
    assert client.put(f"{base}").status_code in (200, 201, 204)
    written: dict[str, bytes] = {}
    for name in NAMES:
        assert client.put(f"{base}/{name}", headers=OCTET).status_code == 201
        written[name] = b""
    for streams in rounds:
        turns = [name for name in streams for _ in range(rng.randrange(10, 20))]
        rng.shuffle(turns)
        for name in turns:
            chunk = rng.randbytes(rng.randrange(1, 400))
            r = client.post(f"{base}/{name}", content=chunk, headers=OCTET)
            assert r.status_code in (200, 204), r.text
            written[name] += chunk
        settle()
    return written


def cold_entries(moto: MotoS3, prefix: str, bucket: str, name: str) -> list[catalog.Entry]:
    """A stream's segments and pack slices, as the store's catalog (manifest and pack indexes) has them."""
    found = catalog.stream(moto.store(prefix), bucket, name)
    assert found is not None, f"{bucket}/{name} is in no manifest or pack index"
    return found.entries


def test_cluster_serves_tiered_data_byte_exact_on_every_node(tmp_path: Path, moto: MotoS3, spark: Any) -> None:
    cluster = RillCluster(tmp_path, 3, *cold_args(moto, "c1"), *SMALL_SEGMENTS, env=AWS_ENV).start()
    rng = random.Random(5)
    try:
        leader = cluster.nodes[cluster.wait_for_leader()]
        with httpx.Client(follow_redirects=True, timeout=10) as client:
            settle = functools.partial(wait_for, lambda: all_tiered(leader.url), what="a round's tiering")
            written = write_streams(client, leader.url + "/ds/tiers", rng, ROUNDS, settle)
            json_url = leader.url + "/ds/tiers/events"
            assert client.put(json_url, headers={"content-type": "application/json"}).status_code == 201
            messages = [{"n": i, "pad": "x" * rng.randrange(0, 300)} for i in range(60)]
            for message in messages:
                assert client.post(json_url, json=[message]).status_code in (200, 204)
            for node in cluster.nodes.values():
                wait_for(lambda node=node: all_tiered(node.url), what=f"tiering seen on {node.url}")

            entries = {name: cold_entries(moto, "c1", "tiers", name) for name in written}
            for name, data in written.items():
                ranges = [(e.first, e.next) for e in entries[name]]
                assert len(ranges) >= 3, "a stream's rounds are sealed apart: several entries each"
                assert ranges[0][0] == 0 and ranges[-1][1] == len(data)
                assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False)), "contiguous"
            # Each round's data is sealed before the next, in packs where streams were due together.
            assert any(e.packed for e in entries["alpha"]) and any(not e.packed for e in entries["alpha"])
            assert moto.keys(f"c1/{manifest_key('tiers', 'alpha')}"), "alpha's own segment: a manifest names both"

            for node in cluster.nodes.values():
                for name, data in written.items():
                    url = f"{node.url}/ds/tiers/{name}"
                    assert read_all(client, url) == data
                    for _ in range(5):
                        at = rng.randrange(len(data))
                        assert read_all(client, url, f"0000000000000000_{at:016d}") == data[at:]
                got = client.get(f"{node.url}/ds/tiers/events", params={"offset": "-1"}).json()
                assert got == messages
            follower = next(n for i, n in cluster.nodes.items() if n is not leader)
            assert read_sse(client, follower.url + "/ds/tiers/alpha") == written["alpha"]

            # A long-poll from a cold offset answers at once with the cold bytes.
            r = client.get(follower.url + "/ds/tiers/gamma", params={"offset": "-1", "live": "long-poll"})
            assert r.status_code == 200 and written["gamma"].startswith(r.content) and r.content
        check_spark_reads(spark, moto, written, messages)
    finally:
        cluster.stop()


def check_spark_reads(spark: Any, moto: MotoS3, written: dict[str, bytes], messages: list[Any]) -> None:
    """Spark loads what the cluster tiered straight from S3 (segments and pack slices): the same bytes
    as the HTTP reads, and filters prune entries."""
    from pyspark.sql.functions import col

    options = {
        "store": f"s3://{BUCKET}/c1",
        "s3_endpoint_url": moto.endpoint_url,
        "access_key_id": "test",
        "secret_access_key": "test",
        "region": "us-east-1",
        "bucket": "tiers",
        "include_hot": "false",  # all of it is tiered by now
    }
    rows = spark.read.format("rill").options(**options).load().select("stream", "offset", "payload").collect()
    streams: dict[str, list[tuple[str, bytes]]] = {}
    for row in rows:
        streams.setdefault(row["stream"], []).append((row["offset"], bytes(row["payload"])))
    got = {name: b"".join(p for _, p in sorted(parts)) for name, parts in streams.items()}
    assert {name: got[name] for name in written} == written
    assert json.loads(b"[" + b",".join(p for _, p in sorted(streams["events"])) + b"]") == messages

    # A partition per segment of alpha's own and per pack holding a slice of it; the worker packs a
    # stream at most once per pack, so that is a partition per entry.
    alpha = {**options, "stream": "alpha"}
    every = spark.read.format("rill").options(**alpha).load()
    entries = cold_entries(moto, "c1", "tiers", "alpha")
    assert every.rdd.getNumPartitions() == len({e.key for e in entries}) == len(entries) >= 3
    cut = format_offset(entries[2].first)
    tail = every.filter(col("offset") >= cut)
    assert tail.rdd.getNumPartitions() == len(entries) - 2, "entries below the cut are not read"
    payloads = [bytes(r["payload"]) for r in tail.orderBy("offset").collect()]
    assert b"".join(payloads) == written["alpha"][entries[2].first :]


def test_store_outage_answers_503_past_the_budget_and_drains_after(tmp_path: Path, moto: MotoS3) -> None:
    node = RillProcess(
        tmp_path / "n",
        None,
        *cold_args(moto, "outage"),
        *SMALL_SEGMENTS,
        "--hot-backlog-budget",
        "30000",
        # No shared tail: the evicted records must be only in the store, which is down.
        env={**AWS_ENV, "RILL_TAIL_CACHE_BYTES": "0"},
    ).start()
    rng = random.Random(9)
    try:
        with httpx.Client(base_url=node.url, timeout=10) as client:
            assert client.put("/ds/outage").status_code == 201
            assert client.put("/ds/outage/s", headers=OCTET).status_code == 201
            acked = b""
            for _ in range(20):
                chunk = rng.randbytes(500)
                assert client.post("/ds/outage/s", content=chunk, headers=OCTET).status_code == 204
                acked += chunk
            wait_for(lambda: all_tiered(node.url), what="tiering before the outage")

            before = len(acked)
            moto.stop()
            refused = None
            for _ in range(400):
                chunk = rng.randbytes(500)
                r = client.post("/ds/outage/s", content=chunk, headers=OCTET)
                if r.status_code == 503:
                    refused = r
                    break
                assert r.status_code == 204, r.text
                acked += chunk
            assert refused is not None, "appends kept succeeding past the backlog budget"
            assert refused.headers["retry-after"] and refused.json()["error"]["code"] == "cold_tier_backlog"
            assert len(acked) >= 30000
            wait_for(lambda: tiering(node.url)["available"] is False, what="the worker to notice the outage")
            # Data still on local disk stays readable; the evicted part waits for the store.
            assert read_all(client, "/ds/outage/s", f"0000000000000000_{before:016d}") == acked[before:]
            cold = client.get("/ds/outage/s", params={"offset": "-1"})
            assert cold.status_code == 503 and cold.headers["retry-after"]

            moto.start()
            wait_for(lambda: all_tiered(node.url), timeout=60, what="the backlog to drain")
            assert tiering(node.url)["available"] is True
            assert client.post("/ds/outage/s", content=b"after", headers=OCTET).status_code == 204
            acked += b"after"
            assert read_all(client, "/ds/outage/s") == acked
    finally:
        node.stop()


def test_deleted_stream_objects_are_removed_but_a_fork_keeps_them(tmp_path: Path, moto: MotoS3) -> None:
    # No packs: this is about a stream's own directory (packs are collected by their reference counts).
    # A backup a second: an object goes only once a state backup newer than its release is taken.
    env = {**AWS_ENV, "RILL_PACK_BELOW_BYTES": "0", **FREQUENT_BACKUPS}
    node = RillProcess(tmp_path / "n", None, *cold_args(moto, "gc"), *SMALL_SEGMENTS, env=env).start()
    rng = random.Random(3)
    try:
        with httpx.Client(base_url=node.url, timeout=10) as client:
            written = write_streams(client, "/ds/gcbucket", rng)
            wait_for(lambda: all_tiered(node.url), what="tiering")
            assert moto.keys("gc/gcbucket/alpha/")

            assert client.delete("/ds/gcbucket/alpha").status_code == 204
            wait_for(lambda: not moto.keys("gc/gcbucket/alpha/"), what="alpha's objects to go")
            assert moto.keys("gc/gcbucket/gamma/"), "other streams keep theirs"

            headers = {**OCTET, "stream-forked-from": "gamma"}
            assert client.put("/ds/gcbucket/fork", headers=headers).status_code == 201
            assert client.delete("/ds/gcbucket/gamma").status_code == 204
            time.sleep(2)  # several tiering passes: nothing of gamma's may go while the fork reads it
            assert moto.keys("gc/gcbucket/gamma/segments/")
            assert read_all(client, "/ds/gcbucket/fork") == written["gamma"]

            assert client.delete("/ds/gcbucket/fork").status_code == 204
            wait_for(lambda: not moto.keys("gc/gcbucket/gamma/"), what="gamma's objects after its fork")
            wait_for(lambda: tiering(node.url)["deletion_queue"] == 0, what="the deletion queue to empty")
            assert moto.keys("gc/gcbucket/nested%2Fbeta/segments/")
    finally:
        node.stop()


def test_file_store_default_and_forks_inside_an_evicted_message(tmp_path: Path) -> None:
    """The embedded default (a directory under the data dir), and a fork whose sub-offset points into
    a record that only the cold tier still has: the proposer fetches the record for the apply."""
    node = RillProcess(tmp_path / "n", None, *SMALL_SEGMENTS).start()
    try:
        with httpx.Client(base_url=node.url, timeout=10) as client:
            assert client.put("/ds/files").status_code == 201
            assert client.put("/ds/files/j", headers={"content-type": "application/json"}).status_code == 201
            offsets, messages = [], []
            for i in range(40):
                batch = [{"i": i, "k": k, "pad": "y" * 90} for k in range(3)]
                r = client.post("/ds/files/j", json=batch)
                assert r.status_code == 204
                offsets.append(r.headers["stream-next-offset"])
                messages += batch
            wait_for(lambda: all_tiered(node.url), what="tiering to the file store")
            assert tiering(node.url)["store"] == (tmp_path / "n" / "cold").resolve().as_uri()
            assert list((tmp_path / "n" / "cold" / "files" / "j" / "segments").glob("*.parquet"))

            # offsets[9] is where the 11th append's record starts; take its first two messages.
            headers = {
                "content-type": "application/json",
                "stream-forked-from": "j",
                "stream-fork-offset": offsets[9],
                "stream-fork-sub-offset": "2",
            }
            r = client.put("/ds/files/f", headers=headers)
            assert r.status_code == 201, r.text
            assert client.get("/ds/files/f", params={"offset": "-1"}).json() == messages[: 30 + 2]
            r = client.get("/ds/files/j", params={"offset": offsets[19]})
            assert r.json() == messages[60:]
            mid = client.get("/ds/files/j", params={"offset": f"{offsets[19][:-16]}{offset_of(offsets[19]) + 1:016d}"})
            assert mid.status_code == 400, "inside a JSON record is not a message boundary, evicted or not"
    finally:
        node.stop()
