"""A real `rill serve` tiering to moto's S3 server, for the Spark tests that read hot and cold data.

Segments seal by size only (4 KiB), so each stream keeps a stable part that is not tiered, and
tiered records are evicted at once, so the records route answers 409 below the tiered offset.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

from app.tiering import catalog
from tests.moto import MotoS3
from tests.server import RillProcess, read_to_tail

AWS_ENV = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}
PREFIX = "hot-tail"
BUCKET = "hotb"
SEGMENTS = ("--segment-max-bytes", "4096", "--segment-max-age", "3600", "--local-disk-budget", "0")
OCTET = {"content-type": "application/octet-stream"}


@pytest.fixture(scope="session")
def node(tmp_path_factory: pytest.TempPathFactory, moto_s3: MotoS3) -> Iterator[RillProcess]:
    cold = ("--cold-store", f"s3://{moto_s3.bucket}/{PREFIX}", "--s3-endpoint-url", moto_s3.endpoint_url)
    server = RillProcess(tmp_path_factory.mktemp("hot") / "n", None, *cold, *SEGMENTS, env=AWS_ENV).start()
    assert httpx.put(f"{server.url}/ds/{BUCKET}").status_code == 201
    yield server
    server.stop()


def spark_options(moto_s3: MotoS3, node: RillProcess, **extra: str) -> dict[str, str]:
    return {
        "store": f"s3://{moto_s3.bucket}/{PREFIX}",
        "s3_endpoint_url": moto_s3.endpoint_url,
        "path_style": "true",
        "access_key_id": "test",
        "secret_access_key": "test",
        "region": "us-east-1",
        "bucket": BUCKET,
        "url": node.url,
        **extra,
    }


def tiered_end(moto_s3: MotoS3, stream: str) -> int:
    """Where the stream's tiered part ends, by the store's catalog: its manifest, or the indexes of the
    packs holding its slices (0 before the first)."""
    found = catalog.stream(moto_s3.store(PREFIX), BUCKET, stream)
    return found.entries[-1].next if found is not None and found.entries else 0


def wait_for_tiering(moto_s3: MotoS3, stream: str, least: int) -> int:
    deadline = time.monotonic() + 30
    while (end := tiered_end(moto_s3, stream)) < least:
        assert time.monotonic() < deadline, f"{stream} was not tiered past {least} in time"
        time.sleep(0.1)
    return end


def make_stream(node: RillProcess, name: str, records: list[bytes]) -> str:
    url = f"{node.url}/ds/{BUCKET}/{name}"
    assert httpx.put(url, headers=OCTET).status_code == 201
    with httpx.Client() as http:
        for payload in records:
            assert http.post(url, content=payload, headers=OCTET).status_code in (200, 204)
    return url


def read_http(url: str) -> bytes:
    with httpx.Client() as http:
        return read_to_tail(http, url)


def payloads(count: int, start: int = 0) -> list[bytes]:
    return [f"{i:05d}:".encode() + bytes([65 + i % 26]) * (90 + i % 17) for i in range(start, start + count)]
