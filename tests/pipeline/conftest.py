"""One Spark session, one moto S3 server, and the same cold-tier layout written to an S3 and a file store."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from app.domain.offsets import format_offset
from app.tiering.segment import SCHEMA, Manifest, Record, build, entry, manifest_key, segment_key
from app.tiering.store import ObjectStore, StoreOptions, open_store
from tests.moto import MotoS3
from tests.pipeline.live import node  # noqa: F401 - a fixture for the modules here

BASE_MS = 1_709_337_590_000  # 2024-03-01T23:59:50Z: "orders" crosses midnight after its 10th record
S3_BUCKET = "rill-cold-tests"  # the session moto server's bucket (tests/conftest.py)
FAKE_KEYS = {"access_key_id": "testing", "secret_access_key": "testing", "region": "us-east-1"}

# bucket -> stream -> records per segment. "big" holds one segment of several 1 MiB row groups.
LAYOUT: dict[str, dict[str, list[int]]] = {
    "b1": {"orders": [10, 10, 10], "logs/app": [4, 3], "logs/db": [5], "logsx": [2], "big": [14]},
    "b2": {"orders": [3]},
}
BIG_PAYLOAD = 300 * 1024


@dataclass
class Cold:
    """A store holding LAYOUT, and what was written to it."""

    kind: str
    options: dict[str, str]  # the data source options reaching the store (no bucket)
    store: ObjectStore
    records: dict[tuple[str, str], list[Record]] = field(default_factory=dict)
    manifests: dict[tuple[str, str], Manifest] = field(default_factory=dict)

    def opts(self, bucket: str = "b1", **extra: str) -> dict[str, str]:
        # A store written here, with no server beside it: the cold tier is all there is.
        return {**self.options, "bucket": bucket, "include_hot": "false", **extra}

    def payload(self, bucket: str, stream: str, lo: int = 0, hi: int | None = None) -> bytes:
        """The bytes of the stream's records starting in [lo, hi)."""
        recs = self.records[(bucket, stream)]
        return b"".join(r.payload for r in recs if lo <= r.pos and (hi is None or r.pos < hi))


def _payload(stream: str, i: int) -> bytes:
    if stream == "big":
        return bytes([i % 251]) * BIG_PAYLOAD
    return f"{stream}#{i}:{'x' * (i % 7)};".encode()


def write_stream(store: ObjectStore, bucket: str, stream: str, sizes: list[int]) -> tuple[list[Record], Manifest]:
    """Segments of `sizes` records each and their manifest, the way the server lays them out."""
    manifest = Manifest(bucket, stream, "text/plain")
    records: list[Record] = []
    pos = 0
    for size in sizes:
        seg: list[Record] = []
        for _ in range(size):
            i = len(records) + len(seg)
            producer = ("p1", 1, i) if i % 3 == 0 else None
            payload = _payload(stream, i)
            seg.append(Record(pos, BASE_MS + i * 1000, payload, producer))
            pos += len(payload)
        data = build(bucket, stream, "text/plain", seg)
        key = segment_key(bucket, stream, seg[0].pos, pos)
        store.put(key, data)
        manifest.segments.append(entry(bucket, stream, seg, data))
        records.extend(seg)
    store.put(manifest_key(bucket, stream), manifest.to_json())
    return records, manifest


def fill(cold: Cold) -> Cold:
    for bucket, streams in LAYOUT.items():
        for stream, sizes in streams.items():
            recs, manifest = write_stream(cold.store, bucket, stream, sizes)
            cold.records[(bucket, stream)] = recs
            cold.manifests[(bucket, stream)] = manifest
    # Objects a reader must not mistake for data: a segment no manifest lists yet (mid-upload) and a
    # nested key that only looks like a manifest.
    orphan = [Record(10_000, BASE_MS, b"orphan")]
    cold.store.put(segment_key("b1", "orders", 10_000, 10_006), build("b1", "orders", "text/plain", orphan))
    cold.store.put("b1/orders/segments/manifest.json", b"not json")
    return cold


@pytest.fixture(scope="session")
def moto_url(moto_s3: MotoS3) -> str:
    return moto_s3.endpoint_url


def s3_options(moto_url: str, prefix: str) -> dict[str, str]:
    return {"store": f"s3://{S3_BUCKET}/{prefix}", "s3_endpoint_url": moto_url, "path_style": "true", **FAKE_KEYS}


@pytest.fixture(scope="session")
def file_cold(tmp_path_factory: pytest.TempPathFactory) -> Cold:
    root: Path = tmp_path_factory.mktemp("cold")
    return fill(Cold("file", {"store": root.as_uri()}, open_store(root.as_uri())))


@pytest.fixture(scope="session")
def s3_cold(moto_url: str) -> Cold:
    options = s3_options(moto_url, "tier")
    store = open_store(options["store"], StoreOptions(endpoint_url=moto_url, path_style=True, **FAKE_KEYS))
    return fill(Cold("s3", options, store))


@pytest.fixture(params=["file", "s3"])
def cold(request: pytest.FixtureRequest) -> Cold:
    """The layout in each kind of store: every test using it runs against both."""
    return request.getfixturevalue(f"{request.param}_cold")  # type: ignore[no-any-return]


Keep = Callable[[Record], bool]


def load(spark: SparkSession, options: dict[str, str]) -> DataFrame:
    return spark.read.format("rill").options(**options).load()


def rows(df: DataFrame) -> list[tuple[Any, ...]]:
    """Every row as a plain tuple (append_time as ms), in stream/offset order."""
    cols = [F.unix_millis(c).alias(c) if c == "append_time" else F.col(c) for c in SCHEMA.names]
    out = [tuple(bytes(v) if isinstance(v, bytearray) else v for v in r) for r in df.select(*cols).collect()]
    return sorted(out)


def expected(cold: Cold, bucket: str, streams: list[str], keep: Keep = lambda r: True) -> list[tuple[Any, ...]]:
    """The rows a read of these streams' records (those `keep` keeps) has, as `rows` gives them."""
    out = []
    for stream in streams:
        for r in cold.records[(bucket, stream)]:
            if keep(r):
                nxt = format_offset(r.pos + len(r.payload))
                producer = r.producer or (None,) * 3
                out.append((bucket, stream, format_offset(r.pos), nxt, r.time, "text/plain", *producer, r.payload))
    return sorted(out)
