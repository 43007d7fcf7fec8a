"""HTTP tests for /ds stream bootstrap: the latest snapshot and what follows it, as multipart/mixed.

Every test works on its own streams (unique names) in one module bucket on the session server.
Error responses are checked with `assert_error` ({"error": {"code", "message"}}, application/json);
rejected writes are checked to leave the stream's data and tail unchanged.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest

from app.protocol import bootstrap
from tests.http.ds_helpers import create, frames, parse_multipart, read, tail
from tests.http.helpers import JSON_CT, TEXT, assert_error, uid
from tests.inprocess import node_client


@pytest.fixture()
def path(bucket: str) -> str:
    """A fresh, not yet created stream path in the module bucket (not conftest's per-family `path`)."""
    return f"/ds/{bucket}/s-{uid()}"


def test_bootstrap_without_snapshot_json_one_part_per_message(client: httpx.Client, path: str) -> None:
    create(client, path, b'[{"a":1},{"b":2}]', b'"three"', headers=JSON_CT)
    batch = client.post(f"{path}/append-batch", headers=JSON_CT, content=frames(b"[4,5]", b"6"))
    assert [r["status"] for r in batch.json()] == [204, 204]
    end = tail(client, path)

    boot = client.get(f"{path}/bootstrap")
    assert boot.status_code == 200
    assert boot.headers["stream-snapshot-offset"] == "-1"
    assert boot.headers["stream-next-offset"] == end
    assert boot.headers["stream-up-to-date"] == "true"
    assert "stream-closed" not in boot.headers
    parts = parse_multipart(boot)
    assert parts[0][1] == b""  # no snapshot: an empty first part
    assert [ct for ct, _ in parts[1:]] == ["application/json"] * 6
    assert [json.loads(body) for _, body in parts[1:]] == [{"a": 1}, {"b": 2}, "three", 4, 5, 6]

    # Reading on from Stream-Next-Offset gives exactly what came after.
    assert client.post(path, headers=JSON_CT, content=b'{"later":true}').status_code == 204
    after = read(client, path, boot.headers["stream-next-offset"])
    assert after.json() == [{"later": True}]


def test_bootstrap_with_snapshot_byte_stream(client: httpx.Client, path: str) -> None:
    _, o1, _, o3 = create(client, path, b"a", b"bb", b"ccc")
    blob = b"state after a"
    put = client.put(f"{path}/snapshot/{o1}", headers={"content-type": "application/x-snap"}, content=blob)
    assert put.status_code == 201

    boot = client.get(f"{path}/bootstrap")
    assert boot.status_code == 200
    assert boot.headers["stream-snapshot-offset"] == o1
    assert boot.headers["stream-next-offset"] == o3
    assert boot.headers["stream-up-to-date"] == "true"
    assert parse_multipart(boot) == [("application/x-snap", blob), ("text/plain", b"bb"), ("text/plain", b"ccc")]

    # A snapshot at the tail: nothing after it.
    assert client.put(f"{path}/snapshot/{o3}", content=b"all").status_code == 201
    boot = client.get(f"{path}/bootstrap")
    assert boot.headers["stream-snapshot-offset"] == o3
    assert parse_multipart(boot) == [("application/octet-stream", b"all")]
    assert client.post(path, headers=TEXT, content=b"dddd").status_code == 204
    assert read(client, path, boot.headers["stream-next-offset"]).content == b"dddd"


def test_bootstrap_of_an_empty_stream(client: httpx.Client, path: str) -> None:
    (empty,) = create(client, path)
    boot = client.get(f"{path}/bootstrap")
    assert boot.status_code == 200
    assert boot.headers["stream-snapshot-offset"] == "-1"
    assert boot.headers["stream-next-offset"] == empty
    assert boot.headers["stream-up-to-date"] == "true"
    assert [body for _, body in parse_multipart(boot)] == [b""]


def test_bootstrap_of_a_closed_stream(client: httpx.Client, path: str) -> None:
    create(client, path, b"one", b"two")
    closed = client.post(path, headers={"stream-closed": "true"})
    assert closed.status_code == 204
    boot = client.get(f"{path}/bootstrap")
    assert boot.status_code == 200
    assert boot.headers["stream-closed"] == "true"
    assert boot.headers["stream-up-to-date"] == "true"
    assert [body for _, body in parse_multipart(boot)] == [b"", b"one", b"two"]
    head = client.head(f"{path}/bootstrap")
    assert head.status_code == 200 and head.content == b""
    assert head.headers["stream-closed"] == "true"
    assert head.headers["content-type"].startswith("multipart/mixed")


@pytest.mark.parametrize("live", ["long-poll", "sse", "", "true"])
def test_bootstrap_with_live_is_400(client: httpx.Client, path: str, live: str) -> None:
    create(client, path, b"x")
    assert_error(client.get(f"{path}/bootstrap", params={"live": live}), 400)


@pytest.mark.anyio
async def test_bootstrap_parts_stay_within_the_limit_however_small_the_messages(tmp_path: Path) -> None:
    """A part per message costs a head of about 90 bytes: a record of a million one-digit messages
    would make a response 45 times its size. Records whose parts would pass the limit wait for a
    plain read, the first one too."""
    limit = 64 * 1024
    async with node_client(tmp_path, bootstrap_max_bytes=limit) as c:
        path = "/ds/boot-limit/s"
        assert (await c.put("/ds/boot-limit")).status_code == 201
        assert (await c.put(path, headers=JSON_CT)).status_code == 201
        small = [b"[" + b",".join(b"%d" % (i % 10) for i in range(100)) + b"]" for _ in range(50)]
        for body in small:  # 50 records of 100 messages: 5,000 parts, about 450 KB as parts
            assert (await c.post(path, headers=JSON_CT, content=body)).status_code == 204
        boot = await c.get(f"{path}/bootstrap")
        assert boot.status_code == 200 and "stream-up-to-date" not in boot.headers
        assert len(boot.content) <= limit
        parts = parse_multipart(boot)
        assert len(parts) > 1 and (len(parts) - 1) % 100 == 0  # whole records only
        rest = await c.get(path, params={"offset": boot.headers["stream-next-offset"]})
        assert len(rest.json()) == 5_000 - (len(parts) - 1)  # reading on gives exactly the rest

        wide = "/ds/boot-limit/wide"  # one record whose parts alone would pass the limit
        assert (await c.put(wide, headers=JSON_CT)).status_code == 201
        ones = b"[" + b",".join([b"1"] * 100_000) + b"]"
        assert (await c.post(wide, headers=JSON_CT, content=ones)).status_code == 204
        boot = await c.get(f"{wide}/bootstrap")
        assert boot.status_code == 200 and len(boot.content) < 1024
        assert parse_multipart(boot) == [("application/octet-stream", b"")]
        assert boot.headers["stream-next-offset"] == (await c.head(wide)).headers["stream-earliest-offset"]
        assert len((await c.get(wide, params={"offset": boot.headers["stream-next-offset"]})).json()) == 100_000

        for size in range(limit - 400, limit, 8):  # the first part's head and the closing delimiter count too
            near = f"/ds/boot-limit/near-{size}"
            assert (await c.put(near, headers=TEXT, content=b"x" * size)).status_code == 201
            assert len((await c.get(f"{near}/bootstrap")).content) <= limit

        commas = "/ds/boot-limit/commas"  # one message, its commas inside a string: one part, which fits
        message = b'{"csv":"' + b"," * 1000 + b'"}'
        assert (await c.put(commas, headers=JSON_CT, content=message)).status_code == 201
        boot = await c.get(f"{commas}/bootstrap")
        assert parse_multipart(boot)[1:] == [("application/json", message)]
        assert boot.headers.get("stream-up-to-date") == "true"


def test_bootstraps_and_snapshot_reads_renew_a_sliding_ttl(client: httpx.Client, path: str) -> None:
    """Reads renew a sliding TTL (README): a reader that only bootstraps, or fetches the snapshot,
    keeps the stream as one that reads it does."""
    create(client, path, b"a", headers={**TEXT, "stream-ttl": "1"})
    snap = f"{path}/snapshot/{tail(client, path)}"
    assert client.put(snap, content=b"state").status_code == 201
    for i in range(8):  # 2.4 s, past the 1 s TTL
        time.sleep(0.3)
        response = client.get(f"{path}/bootstrap") if i % 2 else client.get(snap)
        assert response.status_code == 200, (i, response.text)


def test_a_record_is_walked_only_when_few_messages_would_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Counting a JSON record's messages exactly walks them in Python (about 2 µs each) on the event
    loop: a record of a million tiny messages under the default 8 MiB limit took 150 ms a bootstrap."""
    walked: list[int] = []

    def prefix(record: bytes, count: int) -> None:
        walked.append(count)

    monkeypatch.setattr(bootstrap, "json_prefix", prefix)
    ones = b",".join([b"1"] * 100_000)
    assert not bootstrap._parts_fit(ones, bootstrap.WALK_AT_MOST)
    assert bootstrap._parts_fit(ones, 100_001) and walked == []  # the comma count settles both
    assert bootstrap._parts_fit(b'{"csv":"a,b,c"}', 2) and walked == [3]
