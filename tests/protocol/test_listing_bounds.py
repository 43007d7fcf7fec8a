"""A listing page costs what it holds: buckets are read in name order from where the page starts
(not all of them sorted; a caller whose grants name its buckets gets them from its grants), and a
page passes over at most SKIP_AT_MOST deleted or expired streams before it ends with `next`."""

from __future__ import annotations

import asyncio
import datetime
import time
from pathlib import Path

import pytest

from app.protocol import buckets
from tests.inprocess import node_client
from tests.protocol.helpers import TEXT

pytestmark = pytest.mark.anyio


async def test_bucket_pages_follow_name_order_and_prefixes(tmp_path: Path) -> None:
    async with node_client(tmp_path) as client:
        for name in ("bkt-c", "bkt-a", "other", "bkt-b"):
            assert (await client.put(f"/ds/{name}")).status_code == 201
        first = (await client.get("/ds", params={"prefix": "bkt-", "limit": "2"})).json()
        assert [b["name"] for b in first["buckets"]] == ["bkt-a", "bkt-b"] and first["next"] == "bkt-b"
        rest = (await client.get("/ds", params={"prefix": "bkt-", "after": "bkt-b"})).json()
        assert [b["name"] for b in rest["buckets"]] == ["bkt-c"] and rest["has_more"] is False
        everything = (await client.get("/ds")).json()
        names = [b["name"] for b in everything["buckets"]]
        assert names == sorted(names) and {"compat.v1", "legacy.streams", "other"} <= set(names)


async def test_a_page_ends_early_rather_than_pass_over_deleted_streams_without_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(buckets, "SKIP_AT_MOST", 3)
    async with node_client(tmp_path) as client:
        assert (await client.put("/ds/bkt-one")).status_code == 201
        expires = time.time() + 1  # all at one moment, however long the creates take on a busy machine
        at = datetime.datetime.fromtimestamp(expires, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        for name in ("a", "b", "c", "d", "e"):
            assert (
                await client.put(f"/ds/bkt-one/{name}", headers={**TEXT, "stream-expires-at": at})
            ).status_code == 201
        assert (await client.put("/ds/bkt-one/z", headers=TEXT)).status_code == 201
        await asyncio.sleep(max(0.0, expires - time.time()) + 0.2)
        # The expiry sweep may remove some of them meanwhile (fewer to pass over): while five remain,
        # the first page passes over three and ends at "c".
        page = (await client.get("/ds/bkt-one")).json()
        if page["has_more"]:
            assert page["streams"] == [] and page["next"] in ("c", "d", "e")
            page = (await client.get("/ds/bkt-one", params={"after": page["next"]})).json()
        assert [s["name"] for s in page["streams"]] == ["z"] and page["has_more"] is False
