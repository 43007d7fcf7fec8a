"""One error vocabulary: a missing stream is `stream_not_found` on every method of every family and
/ds sub-resource, a missing bucket `bucket_not_found`, an unknown route `not_found`; every code a
request gets is one the OpenAPI document lists."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import yaml

from tests.http.helpers import uid
from tests.inprocess import Node
from tests.protocol.helpers import BINARY, JSON_CT, TEXT, create, error_code

pytestmark = pytest.mark.anyio

ZERO = "0000000000000000_0000000000000000"
PRODUCER = {"producer-id": "p", "producer-epoch": "0", "producer-seq": "0"}
FRAME = b"\x00\x00\x00\x01x"
OPENAPI = Path(__file__).resolve().parents[2] / "openapi" / "rill.yaml"
DOCUMENTED = set(yaml.safe_load(OPENAPI.read_text(encoding="utf-8"))["components"]["schemas"]["ErrorCode"]["enum"])

# (method, path suffix after the stream's path, headers, body) for a stream that does not exist.
STREAM_REQUESTS = [
    ("GET", "", {}, b""),
    ("GET", "?offset=-1", {}, b""),
    ("GET", "?offset=now", {}, b""),
    ("GET", f"?offset={ZERO}&live=long-poll", {}, b""),
    ("GET", "?offset=-1&live=sse", {}, b""),
    ("GET", "", {"if-none-match": '"1:0:0"'}, b""),
    ("HEAD", "", {}, b""),
    ("POST", "", TEXT, b"x"),
    ("POST", "", {**TEXT, "stream-seq": "a"}, b"x"),
    ("POST", "", {**TEXT, **PRODUCER}, b"x"),
    ("POST", "", {"stream-closed": "true"}, b""),
    ("POST", "", JSON_CT, b"[1]"),
    ("DELETE", "", {}, b""),
]
SUB_RESOURCE_REQUESTS = [
    ("GET", "/attrs", {}, b""),
    ("HEAD", "/attrs", {}, b""),
    ("PUT", "/attrs", JSON_CT, b"{}"),
    ("GET", "/snapshot", {}, b""),
    ("HEAD", "/snapshot", {}, b""),
    ("GET", f"/snapshot/{ZERO}", {}, b""),
    ("HEAD", f"/snapshot/{ZERO}", {}, b""),
    ("PUT", f"/snapshot/{ZERO}", BINARY, b"state"),
    ("PUT", f"/snapshot/{ZERO}", {**BINARY, "stream-snapshot-match": "sha256:" + "0" * 64}, b"state"),
    ("DELETE", f"/snapshot/{ZERO}", {}, b""),
    ("PUT", f"/retention/{ZERO}", {}, b""),
    ("GET", "/bootstrap", {}, b""),
    ("HEAD", "/bootstrap", {}, b""),
    ("POST", "/append-batch", TEXT, FRAME),
]


def _ids(requests: list[tuple[str, str, dict[str, str], bytes]]) -> list[str]:
    return [f"{m} {s or '/'}{' ' + ','.join(h) if h else ''}" for m, s, h, _ in requests]


async def _assert_code(
    client: httpx.AsyncClient, method: str, path: str, headers: dict[str, str], body: bytes, status: int, code: str
) -> None:
    resp = await client.request(method, path, headers=headers, content=body)
    if method == "HEAD":
        assert (resp.status_code, resp.content) == (status, b""), (method, path)
        assert resp.headers["content-type"] == "application/json"
    else:
        error_code(resp, status, code)


@pytest.fixture(params=["ds", "legacy", "compat"])
def base(request: pytest.FixtureRequest, bucket: str) -> str:
    return {"ds": f"/ds/{bucket}/", "legacy": "/streams/", "compat": "/v1/stream/"}[request.param]


@pytest.mark.parametrize(("method", "suffix", "headers", "body"), STREAM_REQUESTS, ids=_ids(STREAM_REQUESTS))
async def test_a_missing_stream_is_stream_not_found(
    client: httpx.AsyncClient, node: Node, base: str, method: str, suffix: str, headers: dict[str, str], body: bytes
) -> None:
    with node.state_unchanged():
        await _assert_code(client, method, f"{base}missing-{uid()}{suffix}", headers, body, 404, "stream_not_found")


@pytest.mark.parametrize(
    ("method", "suffix", "headers", "body"), SUB_RESOURCE_REQUESTS, ids=_ids(SUB_RESOURCE_REQUESTS)
)
async def test_a_missing_stream_is_stream_not_found_on_ds_sub_resources(
    client: httpx.AsyncClient, node: Node, bucket: str, method: str, suffix: str, headers: dict[str, str], body: bytes
) -> None:
    with node.state_unchanged():
        path = f"/ds/{bucket}/missing-{uid()}{suffix}"
        await _assert_code(client, method, path, headers, body, 404, "stream_not_found")


async def test_a_missing_fork_source_is_stream_not_found(client: httpx.AsyncClient, node: Node, base: str) -> None:
    with node.state_unchanged():
        resp = await client.put(f"{base}{uid()}", headers={"stream-forked-from": f"{base}missing-{uid()}"})
        error_code(resp, 404, "stream_not_found")


async def test_a_deleted_stream_is_stream_not_found(client: httpx.AsyncClient, base: str) -> None:
    path = f"{base}{uid()}"
    await create(client, path, b"x")
    assert (await client.delete(path)).status_code == 204
    for method, suffix, headers, body in STREAM_REQUESTS:
        await _assert_code(client, method, path + suffix, headers, body, 404, "stream_not_found")


async def test_a_deleted_fork_source_is_stream_gone_on_every_method(client: httpx.AsyncClient, base: str) -> None:
    source = f"{base}{uid()}"
    await create(client, source, b"x")
    await create(client, f"{base}{uid()}", headers={"stream-forked-from": source})
    assert (await client.delete(source)).status_code == 204
    for method, body in (("GET", b""), ("HEAD", b""), ("POST", b"y"), ("DELETE", b"")):
        await _assert_code(client, method, source, TEXT, body, 410, "stream_gone")


@pytest.mark.parametrize(
    ("method", "suffix", "headers", "body"),
    [*STREAM_REQUESTS, *SUB_RESOURCE_REQUESTS, ("PUT", "", TEXT, b"")],
    ids=[*_ids(STREAM_REQUESTS), *_ids(SUB_RESOURCE_REQUESTS), "PUT /"],
)
async def test_a_missing_bucket_is_bucket_not_found(
    client: httpx.AsyncClient, node: Node, method: str, suffix: str, headers: dict[str, str], body: bytes
) -> None:
    with node.unchanged():
        await _assert_code(client, method, f"/ds/nob-{uid()}/s{suffix}", headers, body, 404, "bucket_not_found")


@pytest.mark.parametrize("method", ["GET", "DELETE"])
async def test_a_missing_bucket_itself_is_bucket_not_found(client: httpx.AsyncClient, method: str) -> None:
    error_code(await client.request(method, f"/ds/nob-{uid()}"), 404, "bucket_not_found")


@pytest.mark.parametrize("path", ["/nope", "/dsx", "/streams", "/v1/stream", "/v1/other/x"])
async def test_an_unknown_route_is_not_found(client: httpx.AsyncClient, path: str) -> None:
    error_code(await client.get(path), 404, "not_found")


def test_the_codes_asserted_here_are_documented() -> None:
    assert {"stream_not_found", "stream_gone", "bucket_not_found", "not_found"} <= DOCUMENTED
