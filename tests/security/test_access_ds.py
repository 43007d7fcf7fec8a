"""Access to /ds buckets and to every /ds sub-resource of a stream, on a node with auth on.

The same cases as test_access_streams.py, and a write token on an admin action (403): bucket
create and delete, `PUT .../retention/{offset}` and snapshot DELETE need admin.
"""

from __future__ import annotations

import struct

import httpx
import pyarrow as pa
import pytest

from app.protocol import buckets
from app.security.scopes import Action
from tests.http.helpers import uid
from tests.inprocess import Node
from tests.security.helpers import (
    COMPAT,
    LEGACY,
    OTHER,
    PRIVATE,
    PUBLIC,
    TOKENS,
    Op,
    SigningKeys,
    World,
    assert_forbidden,
    bearer,
    cases_for,
    check_case,
    error_of,
)

pytestmark = pytest.mark.anyio

R, W, A = Action.READ, Action.WRITE, Action.ADMIN
SUB = "{base}{stream}/"

BUCKET_OPS = [
    Op("bucket-get", "GET", "/ds/{bucket}", R, 200),
    Op("bucket-head", "HEAD", "/ds/{bucket}", R, 200),
    # For a missing bucket an all-powerful token's PUT would create it: compare with a GET of it.
    Op("bucket-put", "PUT", "/ds/{bucket}", A, 200, reference=("GET", "/ds/{bucket}")),
    Op("bucket-delete", "DELETE", "/ds/{bucket}", A, 409),  # the bucket holds the world's stream
]
SUB_OPS = [
    Op("attrs-get", "GET", SUB + "attrs", R, 200),
    Op("attrs-head", "HEAD", SUB + "attrs", R, 200),
    Op("attrs-put", "PUT", SUB + "attrs", W, 204, b'{"title":"t"}', "application/json"),
    Op("append-batch", "POST", SUB + "append-batch", W, 200, struct.pack(">I", 1) + b"d", "text/plain"),
    Op("bootstrap", "GET", SUB + "bootstrap", R, 200),
    Op("bootstrap-head", "HEAD", SUB + "bootstrap", R, 200),
    Op("records", "GET", SUB + "__ds/records", R, 200),
    Op("records-head", "HEAD", SUB + "__ds/records", R, 200),
    Op("snapshot-latest", "GET", SUB + "snapshot", R, 307),
    Op("snapshot-get", "GET", SUB + "snapshot/{o1}", R, 200),
    Op("snapshot-head", "HEAD", SUB + "snapshot/{o1}", R, 200),
    Op("snapshot-put", "PUT", SUB + "snapshot/{o3}", W, 201, b"s3", "text/plain"),
    Op("snapshot-delete", "DELETE", SUB + "snapshot/{o1}", A, 204),
    Op("retention-put", "PUT", SUB + "retention/{o1}", A, 204),
]


def matrix() -> list[object]:
    params: list[object] = []
    for op in BUCKET_OPS + SUB_OPS:
        for case in cases_for(op, "ds"):
            params.append(pytest.param(op, case, id=f"{op.id}-{case}"))
    return params


async def verify(client: httpx.AsyncClient, world: World, resp: httpx.Response, op: Op) -> None:
    """What a permitted request did, seen through an all-powerful token."""
    root = bearer(TOKENS["root"])
    stream = world.base + world.stream
    o1, o2, o3 = world.offsets
    if op.id == "bucket-get":
        listing = resp.json()
        assert listing["bucket"] == world.bucket
        assert world.stream in [s["name"] for s in listing["streams"]]
    elif op.id in ("bucket-head", "attrs-head", "bootstrap-head", "records-head"):
        assert resp.content == b""
    elif op.id in ("bucket-put", "bucket-delete"):
        if op.id == "bucket-delete":
            assert error_of(resp)["code"] == "bucket_not_empty"
        assert (await client.head(f"/ds/{world.bucket}/{world.stream}", headers=root)).status_code == 200
    elif op.id == "attrs-get":
        assert resp.json() == {}
    elif op.id == "attrs-put":
        assert (await client.get(stream + "/attrs", headers=root)).json() == {"title": "t"}
    elif op.id == "append-batch":
        assert len(resp.json()) == 1
        assert (await client.get(stream, params={"offset": "-1"}, headers=root)).content == b"abcd"
    elif op.id == "bootstrap":
        assert resp.headers["content-type"].startswith("multipart/mixed; boundary=")
        assert resp.headers["stream-snapshot-offset"] == o2
        assert b"\r\n\r\ns2\r\n" in resp.content and b"\r\n\r\nc\r\n" in resp.content
    elif op.id == "records":
        assert resp.headers["content-type"] == "application/vnd.apache.arrow.stream"
        assert b"".join(pa.ipc.open_stream(resp.content).read_all()["payload"].to_pylist()) == b"abc"
    elif op.id == "snapshot-latest":
        assert resp.headers["location"].endswith(f"/snapshot/{o2}")
    elif op.id == "snapshot-get":
        assert resp.content == b"s1"
    elif op.id == "snapshot-head":
        assert resp.headers["stream-snapshot-offset"] == o1
    elif op.id == "snapshot-put":
        assert (await client.get(f"{stream}/snapshot/{o3}", headers=root)).content == b"s3"
    elif op.id == "snapshot-delete":
        assert (await client.get(f"{stream}/snapshot/{o1}", headers=root)).status_code == 404
    elif op.id == "retention-put":
        assert resp.headers["stream-earliest-offset"] == o1
        assert (await client.get(stream, params={"offset": "-1"}, headers=root)).content == b"bc"
    else:
        raise AssertionError(op.id)


@pytest.mark.parametrize(("op", "case"), matrix())
async def test_ds_access(client: httpx.AsyncClient, auth_node: Node, keys: SigningKeys, op: Op, case: str) -> None:
    async def check(client: httpx.AsyncClient, world: World, resp: httpx.Response) -> None:
        await verify(client, world, resp, op)

    await check_case(client, auth_node, keys, "ds", op, case, check)


def test_the_matrix_covers_every_sub_resource() -> None:
    from app.protocol.target import SUBROUTES

    def kind(path: str) -> str:
        rest = path.split("/", 1)[1]
        return rest.rsplit("/", 1)[0] if "{o" in rest else rest

    covered = {(kind(op.path), op.method, "{o" in op.path) for op in SUB_OPS}
    for kind, (plain, with_offset) in SUBROUTES.items():
        for methods, has_offset in ((plain, False), (with_offset, True)):
            for method in methods:
                assert (kind, method, has_offset) in covered or method == "HEAD", (kind, method, has_offset)
    assert {op.method for op in BUCKET_OPS} == {"GET", "HEAD", "PUT", "DELETE"}


async def test_bucket_create_and_delete_with_the_buckets_admin_scope(client: httpx.AsyncClient) -> None:
    """admin:scratch may create and delete `scratch`; write or another bucket's admin may not."""
    admin = bearer(TOKENS["scratch-admin"])
    assert (await client.put("/ds/scratch", headers=bearer(TOKENS["zeta-admin"]))).status_code == 404
    assert (await client.put("/ds/scratch", headers=admin)).status_code == 201
    assert (await client.get("/ds/scratch", headers=admin)).json()["streams"] == []
    assert (await client.put("/ds/scratch/s", headers={**admin, "content-type": "text/plain"})).status_code == 201
    assert (await client.delete("/ds/scratch/s", headers=admin)).status_code == 204
    assert (await client.delete("/ds/scratch", headers=bearer(TOKENS["acme-admin"]))).status_code == 404
    assert (await client.delete("/ds/scratch", headers=admin)).status_code == 204
    missing = await client.get("/ds/scratch", headers=admin)
    assert missing.status_code == 404 and error_of(missing)["code"] == "bucket_not_found"


async def test_root_creates_and_deletes_any_bucket(client: httpx.AsyncClient) -> None:
    root = bearer(TOKENS["root"])
    name = "b-" + uid()
    assert (await client.put(f"/ds/{name}", headers=root)).status_code == 201
    assert (await client.put(f"/ds/{name}", headers=root)).status_code == 200
    assert (await client.delete(f"/ds/{name}", headers=root)).status_code == 204
    assert (await client.delete(f"/ds/{name}", headers=root)).status_code == 404


async def test_a_write_token_may_not_create_its_own_bucket(client: httpx.AsyncClient) -> None:
    for role in ("acme-read", "acme-write"):
        assert_forbidden(await client.put("/ds/acme", headers=bearer(TOKENS[role])))
        assert_forbidden(await client.delete("/ds/acme", headers=bearer(TOKENS[role])))
    assert (await client.get(f"/ds/{OTHER}", headers=bearer(TOKENS["zeta-admin"]))).status_code == 200


async def test_the_bucket_listing_shows_only_what_the_caller_may_read(client: httpx.AsyncClient) -> None:
    async def names(headers: dict[str, str]) -> set[str]:
        resp = await client.get("/ds", params={"limit": 1000}, headers=headers)
        assert resp.status_code == 200, resp.text
        return {b["name"] for b in resp.json()["buckets"]}

    assert await names({}) == {PUBLIC}  # no token: the public buckets alone
    assert await names(bearer(TOKENS["acme-read"])) == {PRIVATE, PUBLIC}
    assert await names(bearer(TOKENS["zeta-admin"])) == {OTHER, PUBLIC}
    assert {PRIVATE, OTHER, PUBLIC, LEGACY, COMPAT} <= await names(bearer(TOKENS["root"]))
    assert (await client.get("/ds", headers={"authorization": "Bearer nope"})).status_code == 401


async def test_no_listing_page_names_a_bucket_the_caller_may_not_read(
    client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not in its buckets, nor in `next`, however many hidden buckets a page would pass over: a
    caller could otherwise page through every hidden name with `after`."""
    monkeypatch.setattr(buckets, "SKIP_AT_MOST", 1)  # as if each page passed over 10,000 hidden ones
    root = bearer(TOKENS["root"])
    hidden = [f"hidden-{uid()}" for _ in range(5)]
    for name in hidden:
        assert (await client.put(f"/ds/{name}", headers=root)).status_code == 201
    for headers in ({}, bearer(TOKENS["acme-read"])):
        seen, after = [], ""
        while True:
            page = (await client.get("/ds", params={"limit": 1, "after": after}, headers=headers)).json()
            seen += [b["name"] for b in page["buckets"]]
            assert page["next"] is None or page["next"] in seen
            if not page["has_more"]:
                break
            after = page["next"]
        assert not set(seen) & set(hidden) and seen == sorted(seen)
        assert (await client.get("/ds", params={"after": hidden[0]}, headers=headers)).json()["next"] in (None, *seen)
