"""Per-bucket quotas (app/security/quotas.py) and the in-flight body budget, through requests."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from app.security.quotas import BucketQuota
from tests.inprocess import node_client
from tests.protocol.helpers import TEXT, error_code, read_all

pytestmark = pytest.mark.anyio


async def test_a_bucket_holds_at_most_its_quota_of_streams(tmp_path: Path) -> None:
    async with node_client(tmp_path, bucket_quota=BucketQuota(max_streams=2)) as client:
        assert (await client.put("/ds/quota1")).status_code == 201
        for name in ("a", "b"):
            assert (await client.put(f"/ds/quota1/{name}", headers=TEXT)).status_code == 201
        error_code(await client.put("/ds/quota1/c", headers=TEXT), 429, "quota_exceeded")
        assert (await client.put("/ds/quota1/a", headers=TEXT)).status_code == 200  # idempotent: not a new one
        assert (await client.head("/ds/quota1/c")).status_code == 404
        assert (await client.put("/ds/other/x", headers=TEXT)).status_code == 404  # quotas are per bucket
        assert (await client.put("/ds/other")).status_code == 201
        assert (await client.put("/ds/other/x", headers=TEXT)).status_code == 201
        assert (await client.delete("/ds/quota1/b")).status_code == 204
        await asyncio.sleep(1.1)  # usage is refreshed from the applied state at most a second late
        assert (await client.put("/ds/quota1/c", headers=TEXT)).status_code == 201


async def test_a_bucket_keeps_at_most_its_quota_of_bytes_and_others_are_unaffected(tmp_path: Path) -> None:
    quotas = {"small": BucketQuota(max_bytes=100)}
    async with node_client(tmp_path, bucket_quotas=quotas) as client:
        for bucket in ("small", "large"):
            assert (await client.put(f"/ds/{bucket}")).status_code == 201
            assert (await client.put(f"/ds/{bucket}/s", headers=TEXT)).status_code == 201
        assert (await client.post("/ds/small/s", headers=TEXT, content=b"x" * 60)).status_code == 204
        resp = await client.post("/ds/small/s", headers=TEXT, content=b"y" * 41)
        error_code(resp, 429, "quota_exceeded")
        assert "100 bytes" in resp.json()["error"]["message"]
        assert (await client.post("/ds/small/s", headers=TEXT, content=b"z" * 40)).status_code == 204
        assert await read_all(client, "/ds/small/s") == b"x" * 60 + b"z" * 40
        assert (await client.post("/ds/large/s", headers=TEXT, content=b"x" * 1000)).status_code == 204
        # A create with a body counts too.
        error_code(await client.put("/ds/small/t", headers=TEXT, content=b"w"), 429, "quota_exceeded")
        assert (await client.head("/ds/small/t")).status_code == 404


async def test_a_producers_retry_is_not_refused_at_the_bytes_quota(tmp_path: Path) -> None:
    """A producer's retry of an append already stored writes nothing: it is answered as a duplicate
    (204) without being proposed, not 429 (a client told its stored append failed may send it again
    under a new seq, and store it twice)."""
    quotas = {"small": BucketQuota(max_bytes=100)}
    producer = {"producer-id": "p", "producer-epoch": "0", "producer-seq": "0"}
    async with node_client(tmp_path, bucket_quotas=quotas) as client:
        assert (await client.put("/ds/small")).status_code == 201
        assert (await client.put("/ds/small/s", headers=TEXT, content=b"c" * 10)).status_code == 201
        assert (await client.post("/ds/small/s", headers={**TEXT, **producer}, content=b"x" * 60)).status_code == 200
        retry = await client.post("/ds/small/s", headers={**TEXT, **producer}, content=b"x" * 60)
        assert retry.status_code == 204 and retry.headers["stream-next-offset"].endswith("70")
        resp = await client.post("/ds/small/s", headers={**TEXT, **producer, "producer-seq": "1"}, content=b"y" * 60)
        error_code(resp, 429, "quota_exceeded")  # new bytes are still counted
        assert await read_all(client, "/ds/small/s") == b"c" * 10 + b"x" * 60


async def test_published_snapshots_count_against_the_bytes_quota(tmp_path: Path) -> None:
    """A writer must not store past its quota as snapshots: up to 64 MiB at every message boundary."""
    quotas = {"small": BucketQuota(max_bytes=1000)}
    async with node_client(tmp_path, bucket_quotas=quotas) as client:
        assert (await client.put("/ds/small")).status_code == 201
        assert (await client.put("/ds/small/s", headers=TEXT, content=b"x" * 100)).status_code == 201
        offset = "0000000000000000_0000000000000100"
        assert (await client.put(f"/ds/small/s/snapshot/{offset}", headers=TEXT, content=b"s" * 800)).status_code == 201
        await asyncio.sleep(1.1)  # usage is refreshed from the applied state at most a second late
        error_code(await client.post("/ds/small/s", headers=TEXT, content=b"y" * 200), 429, "quota_exceeded")
        assert (await client.post("/ds/small/s", headers=TEXT, content=b"y" * 50)).status_code == 204
        big = await client.put("/ds/small/s/snapshot/0000000000000000_0000000000000150", headers=TEXT,
                               content=b"b" * 300_000)  # fmt: skip
        error_code(big, 429, "quota_exceeded")  # refused before its upload
        assert (await client.put(f"/ds/small/s/snapshot/{offset}", headers=TEXT, content=b"s" * 800)).status_code == 204


def _held_back(
    client: httpx.AsyncClient, first: int, rest: int, release: asyncio.Event
) -> asyncio.Task[httpx.Response]:
    """An append declaring `first + rest` bytes that sends `first` of them, the rest once `release` is set."""

    async def body() -> AsyncIterator[bytes]:
        yield b"a" * first
        await release.wait()
        yield b"a" * rest

    headers = {**TEXT, "content-length": str(first + rest)}
    return asyncio.create_task(client.post("/ds/budget/s", headers=headers, content=body()))


async def test_bodies_past_the_in_flight_budget_get_503_and_the_budget_is_returned(tmp_path: Path) -> None:
    async with node_client(tmp_path, max_body_bytes=1000, body_budget_bytes=1500) as client:
        assert (await client.put("/ds/budget")).status_code == 201
        assert (await client.put("/ds/budget/s", headers=TEXT)).status_code == 201
        # One body in flight holds what it has sent, 900 bytes: a second large one does not fit.
        release = asyncio.Event()
        holding = _held_back(client, 900, 100, release)
        await asyncio.sleep(0.2)
        resp = await client.post("/ds/budget/s", headers=TEXT, content=b"b" * 700)
        error_code(resp, 503, "server_busy")
        assert resp.headers["retry-after"] == "1"
        assert (await client.post("/ds/budget/s", headers=TEXT, content=b"c" * 400)).status_code == 204
        release.set()
        assert (await holding).status_code == 204
        # Everything held was given back: a body of the whole limit fits again, many times over.
        for _ in range(3):
            assert (await client.post("/ds/budget/s", headers=TEXT, content=b"d" * 1000)).status_code == 204


async def test_a_body_sent_slowly_holds_only_what_it_has_sent(tmp_path: Path) -> None:
    """A client that declares a large body and trickles it must not hold the budget it has not used:
    a few of them would turn every other write away."""
    async with node_client(tmp_path, max_body_bytes=1000, body_budget_bytes=1500) as client:
        assert (await client.put("/ds/budget")).status_code == 201
        assert (await client.put("/ds/budget/s", headers=TEXT)).status_code == 201
        release = asyncio.Event()
        holding = _held_back(client, 100, 900, release)
        await asyncio.sleep(0.2)
        assert (await client.post("/ds/budget/s", headers=TEXT, content=b"b" * 1000)).status_code == 204
        release.set()
        assert (await holding).status_code == 204
