"""Access checks across the route families on real requests: caching of private data, public_read,
JWTs, malformed credentials, probing for names, and a node with auth off (the default)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.protocol.responses import CACHE_PRIVATE, CACHE_PUBLIC
from app.security.authenticator import AuthSettings
from tests.http.helpers import uid
from tests.inprocess import client_for, running_node
from tests.security.helpers import (
    CHALLENGE,
    COMPAT,
    LEGACY,
    PRIVATE,
    PUBLIC,
    TOKENS,
    SigningKeys,
    assert_forbidden,
    assert_unauthorized,
    bearer,
    error_of,
    make_world,
    mint,
    token_configs,
)

pytestmark = pytest.mark.anyio

ROOT = bearer(TOKENS["root"])
TEXT = {"content-type": "text/plain"}


async def closed_stream(client: httpx.AsyncClient, base: str) -> str:
    """A closed text stream holding "abc", made by root: reads of it are cacheable."""
    path = f"{base}c-{uid()}"
    resp = await client.put(path, content=b"abc", headers={**ROOT, **TEXT, "stream-closed": "true"})
    assert resp.status_code == 201, resp.text
    return path


@pytest.mark.parametrize(
    ("base", "role"),
    [(f"/ds/{PRIVATE}/", "acme-read"), ("/streams/", "legacy-read"), ("/v1/stream/", "compat-read")],
)
async def test_reads_of_a_private_bucket_are_private(client: httpx.AsyncClient, base: str, role: str) -> None:
    path = await closed_stream(client, base)
    for headers in (bearer(TOKENS[role]), ROOT):
        resp = await client.get(path, params={"offset": "-1"}, headers=headers)
        assert resp.status_code == 200 and resp.content == b"abc"
        assert resp.headers["cache-control"] == CACHE_PRIVATE
        # a conditional read is just as private
        again = await client.get(
            path, params={"offset": "-1"}, headers={**headers, "if-none-match": resp.headers["etag"]}
        )
        assert again.status_code == 304 and again.headers["cache-control"] == CACHE_PRIVATE


@pytest.mark.parametrize(("bucket", "cache"), [(PRIVATE, CACHE_PRIVATE), (PUBLIC, CACHE_PUBLIC)])
async def test_a_snapshot_is_cached_as_its_buckets_reads_are(
    client: httpx.AsyncClient, bucket: str, cache: str
) -> None:
    path = await closed_stream(client, f"/ds/{bucket}/")
    tail = (await client.head(path, headers=ROOT)).headers["stream-next-offset"]
    published = await client.put(f"{path}/snapshot/{tail}", content=b"state", headers={**ROOT, **TEXT})
    assert published.status_code == 201, published.text
    resp = await client.get(f"{path}/snapshot/{tail}", headers=bearer(TOKENS["acme-read"]))
    assert resp.status_code == 200 and resp.content == b"state"
    assert resp.headers["cache-control"] == cache


async def test_a_long_poll_of_a_private_bucket_is_private(client: httpx.AsyncClient) -> None:
    world = await make_world(client, "ds")
    resp = await client.get(
        world.base + world.stream,
        params={"offset": world.offsets[0], "live": "long-poll"},
        headers=bearer(TOKENS["acme-read"]),
    )
    assert resp.status_code == 200 and resp.content == b"bc"
    assert resp.headers["cache-control"] == CACHE_PRIVATE


@pytest.mark.parametrize("token", [None, "acme-read", "root"])
async def test_reads_of_a_public_bucket_are_public(client: httpx.AsyncClient, token: str | None) -> None:
    path = await closed_stream(client, f"/ds/{PUBLIC}/")
    resp = await client.get(path, params={"offset": "-1"}, headers=bearer(TOKENS[token] if token else None))
    assert resp.status_code == 200 and resp.content == b"abc"
    assert resp.headers["cache-control"] == CACHE_PUBLIC


async def test_anyone_reads_a_public_bucket_but_nobody_writes_it_without_a_token(client: httpx.AsyncClient) -> None:
    world = await make_world(client, "ds", PUBLIC)
    path = world.base + world.stream
    assert (await client.get(path, params={"offset": "-1"})).content == b"abc"
    assert (await client.head(path)).status_code == 200
    assert (await client.get(f"/ds/{PUBLIC}")).status_code == 200
    assert (await client.get(path + "/bootstrap")).status_code == 200
    assert_unauthorized(await client.post(path, content=b"x", headers=TEXT), invalid=False)
    assert_unauthorized(await client.put(f"/ds/{PUBLIC}/new-{uid()}", headers=TEXT), invalid=False)
    # A token of another bucket sees the public bucket, so its writes are 403, not 404.
    assert_forbidden(await client.post(path, content=b"x", headers={**bearer(TOKENS["zeta-admin"]), **TEXT}))
    assert (await client.get(path, params={"offset": "-1"}, headers=ROOT)).content == b"abc"


async def test_a_bad_token_is_refused_even_where_no_token_is_needed(client: httpx.AsyncClient) -> None:
    """A client that sends a credential learns that it is wrong, rather than reading as anonymous."""
    world = await make_world(client, "ds", PUBLIC)
    path = world.base + world.stream
    for token in (TOKENS["expired"], "rill_" + "x" * 43):
        assert_unauthorized(await client.get(path, params={"offset": "-1"}, headers=bearer(token)), invalid=True)


async def test_public_read_of_a_builtin_bucket(tmp_path: Path) -> None:
    auth = AuthSettings(mode="on", tokens=token_configs({"root": (["admin:*"], None)}, TOKENS), public_read=[LEGACY])
    async with running_node(tmp_path, auth=auth) as node, client_for(node) as client:
        for base in ("/streams/", "/v1/stream/"):
            assert (await client.put(base + "s", content=b"abc", headers={**ROOT, **TEXT})).status_code == 201
        resp = await client.get("/streams/s", params={"offset": "-1"})
        assert resp.status_code == 200 and resp.content == b"abc"
        assert_unauthorized(await client.post("/streams/s", content=b"d", headers=TEXT), invalid=False)
        assert_unauthorized(await client.delete("/streams/s"), invalid=False)
        assert_unauthorized(await client.get("/v1/stream/s", params={"offset": "-1"}), invalid=False)


async def test_jwt_scope_string_and_scp_list(client: httpx.AsyncClient, keys: SigningKeys) -> None:
    world = await make_world(client, "ds")
    path = world.base + world.stream
    writer = bearer(mint(keys.rsa, scope=f"openid write:{PRIVATE} profile"))
    resp = await client.post(path, content=b"d", headers={**writer, **TEXT})
    assert resp.status_code == 204, resp.text
    reader = bearer(mint(keys.ec, kid="ec-1", alg="ES256", scp=["email", f"read:{PRIVATE}"]))
    assert (await client.get(path, params={"offset": "-1"}, headers=reader)).content == b"abcd"
    assert_forbidden(await client.post(path, content=b"e", headers={**reader, **TEXT}))
    assert_forbidden(await client.put(f"{path}/retention/{world.offsets[0]}", headers=writer))


async def test_a_jwt_with_only_other_services_scopes_sees_nothing(client: httpx.AsyncClient, keys: SigningKeys) -> None:
    world = await make_world(client, "ds")
    token = bearer(mint(keys.rsa, scope="openid profile email"))
    resp = await client.get(world.base + world.stream, params={"offset": "-1"}, headers=token)
    assert resp.status_code == 404 and error_of(resp)["code"] == "bucket_not_found"
    resp = await client.get("/streams/anything", headers=token)
    assert resp.status_code == 404 and error_of(resp) == {"code": "stream_not_found", "message": "stream not found"}


@pytest.mark.parametrize(
    ("claims", "words"),
    [
        ({"iss": "https://evil.example"}, "issuer"),
        ({"exp": 1_600_000_000, "iat": 1_599_999_000}, "expired"),
        ({"nbf": 4_000_000_000}, "not yet valid"),
        ({"typ": "JWT"}, "not an access token"),
        ({"kid": "rsa-9"}, "no key in the jwks"),
    ],
)
async def test_invalid_jwts_are_401(
    client: httpx.AsyncClient, keys: SigningKeys, claims: dict[str, Any], words: str
) -> None:
    world = await make_world(client, "ds")
    token = mint(keys.rsa, scope="admin:*", **claims)
    resp = await client.get(world.base + world.stream, params={"offset": "-1"}, headers=bearer(token))
    assert_unauthorized(resp, invalid=True)
    assert words in resp.headers["www-authenticate"].lower()


@pytest.mark.parametrize("header", ["Basic YWxpY2U6c2VjcmV0", "Bearer", "Digest username=alice", TOKENS["root"]])
async def test_a_header_that_is_not_a_bearer_token(client: httpx.AsyncClient, header: str) -> None:
    resp = await client.get(f"/ds/{PRIVATE}", headers={"authorization": header})
    assert resp.status_code == 401
    assert resp.headers["www-authenticate"].startswith('Bearer realm="rill", error="invalid_request"')


async def test_an_unknown_token(client: httpx.AsyncClient) -> None:
    resp = await client.get(f"/ds/{PRIVATE}", headers=bearer("rill_" + "A" * 43))
    assert_unauthorized(resp, invalid=True)
    assert resp.headers["www-authenticate"].endswith('error_description="the token is not valid"')
    assert error_of(resp) == {"code": "unauthorized", "message": "the token is not valid"}


async def test_no_token_body(client: httpx.AsyncClient) -> None:
    resp = await client.post(f"/ds/{PRIVATE}/s", content=b"x", headers=TEXT)
    assert resp.headers["www-authenticate"] == CHALLENGE
    assert error_of(resp) == {"code": "unauthorized", "message": "this needs a bearer token"}


async def test_an_invisible_bucket_answers_alike_whether_the_stream_exists_or_not(client: httpx.AsyncClient) -> None:
    world = await make_world(client, "ds")
    other = bearer(TOKENS["zeta-admin"])
    for suffix in ("", "/attrs", "/bootstrap", f"/snapshot/{world.offsets[0]}"):
        existing = await client.get(world.base + world.stream + suffix, params={"offset": "-1"}, headers=other)
        missing = await client.get(world.base + "no-such-stream" + suffix, params={"offset": "-1"}, headers=other)
        assert existing.status_code == missing.status_code == 404
        assert existing.content == missing.content
        assert existing.headers == missing.headers
    # ... and alike whether the bucket exists or not
    existing = await client.get(f"/ds/{PRIVATE}", headers=other)
    missing = await client.get("/ds/acmf", headers=other)  # a name as long as "acme"
    assert existing.content.replace(b"acme", b"acmf") == missing.content
    assert existing.headers == missing.headers


@pytest.mark.parametrize(("base", "bucket"), [("/streams/", LEGACY), ("/v1/stream/", COMPAT)])
async def test_an_invisible_builtin_bucket_looks_like_a_missing_stream(
    client: httpx.AsyncClient, base: str, bucket: str
) -> None:
    path = await closed_stream(client, base)
    other = bearer(TOKENS["acme-admin"])
    invisible = await client.get(path, params={"offset": "-1"}, headers=other)
    missing = await client.get(base + "no-such-stream", params={"offset": "-1"}, headers=ROOT)
    assert invisible.status_code == missing.status_code == 404
    assert invisible.content == missing.content == b'{"error":{"code":"stream_not_found","message":"stream not found"}}'
    assert invisible.headers == missing.headers


async def test_health_needs_no_token(client: httpx.AsyncClient) -> None:
    assert (await client.get("/healthz")).status_code == 200


@pytest.fixture()
async def open_client(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    async with running_node(tmp_path, auth=AuthSettings()) as node, client_for(node) as client:
        yield client


async def test_auth_off_needs_no_token(open_client: httpx.AsyncClient) -> None:
    client = open_client
    assert (await client.put("/ds/acme")).status_code == 201
    path = "/ds/acme/s"
    assert (await client.put(path, content=b"a", headers=TEXT)).status_code == 201
    resp = await client.post(path, content=b"b", headers=TEXT)
    assert resp.status_code == 204
    tail = resp.headers["stream-next-offset"]
    assert (await client.put(path + "/attrs", content=b'{"title":"t"}')).status_code == 204
    assert (await client.put(f"{path}/snapshot/{tail}", content=b"snap")).status_code == 201
    assert (await client.put(f"{path}/retention/{tail}")).status_code == 204
    assert (await client.post(path, content=b"c", headers={**TEXT, "stream-closed": "true"})).status_code == 204
    read = await client.get(path, params={"offset": tail})
    assert read.status_code == 200 and read.content == b"c"
    assert read.headers["cache-control"] == CACHE_PUBLIC
    sse = await client.get(path, params={"offset": tail, "live": "sse"})  # a closed stream: the response ends
    assert sse.status_code == 200 and "event: data\ndata:c" in sse.text
    for builtin in ("/streams/x", "/v1/stream/x"):
        assert (await client.put(builtin, content=b"z", headers=TEXT)).status_code == 201
        assert (await client.get(builtin, params={"offset": "-1"})).content == b"z"
    assert (await client.delete(path, headers=bearer("anything: ignored when auth is off"))).status_code == 204
    assert (await client.delete("/ds/acme")).status_code == 204


async def test_auth_off_ignores_tokens(open_client: httpx.AsyncClient) -> None:
    resp = await open_client.put("/ds/tokn", headers={"authorization": "Basic nonsense"})
    assert resp.status_code == 201
    assert "www-authenticate" not in resp.headers
