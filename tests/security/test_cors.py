"""CORS: the origins in `cors_origins` may write and send tokens; any other origin may only read."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from tests.inprocess import node_client

pytestmark = pytest.mark.anyio

LISTED = "https://app.example"
OTHER = "https://evil.example"
WRITES = ("PUT", "POST", "DELETE")


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
async def client(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[httpx.AsyncClient]:
    """A node whose `cors_origins` lists one origin."""
    async with node_client(tmp_path_factory.mktemp("cors"), cors_origins=[LISTED], sse_max_seconds=0.2) as c:
        yield c


@pytest.fixture(scope="module")
async def any_origin(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[httpx.AsyncClient]:
    async with node_client(tmp_path_factory.mktemp("cors-any"), cors_origins=["*"]) as c:
        yield c


@pytest.fixture(scope="module")
async def default(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[httpx.AsyncClient]:
    async with node_client(tmp_path_factory.mktemp("cors-default")) as c:
        yield c


def preflight(origin: str, method: str, headers: str | None = None) -> dict[str, str]:
    asked = {"origin": origin, "access-control-request-method": method}
    return asked | ({"access-control-request-headers": headers} if headers else {})


def methods(response: httpx.Response) -> set[str]:
    return {m.strip() for m in response.headers.get("access-control-allow-methods", "").split(",") if m.strip()}


def allowed_headers(response: httpx.Response) -> set[str]:
    return {h.strip().lower() for h in response.headers.get("access-control-allow-headers", "").split(",")}


@pytest.mark.parametrize("method", WRITES)
async def test_the_default_approves_no_write_preflight(default: httpx.AsyncClient, method: str) -> None:
    response = await default.options("/v1/stream/x", headers=preflight(OTHER, method, "content-type"))
    assert response.status_code == 400
    assert "access-control-allow-origin" not in response.headers
    assert not methods(response) & set(WRITES)
    assert response.headers["x-content-type-options"] == "nosniff"


@pytest.mark.parametrize("method", WRITES)
async def test_an_unlisted_origin_may_not_write(client: httpx.AsyncClient, method: str) -> None:
    response = await client.options("/ds/b/s", headers=preflight(OTHER, method, "authorization"))
    assert response.status_code == 400
    assert "access-control-allow-origin" not in response.headers
    assert not methods(response) & set(WRITES)


async def test_an_unlisted_origin_may_not_write_even_without_a_preflight(client: httpx.AsyncClient) -> None:
    """A simple cross-origin POST (text/plain) needs no preflight: the server itself refuses it, and
    every other write, before it runs."""
    created = await client.put("/v1/stream/cors-write", headers={"content-type": "text/plain"}, content=b"kept")
    assert created.status_code == 201
    for method in WRITES:
        response = await client.request(
            method, "/v1/stream/cors-write", headers={"origin": OTHER, "content-type": "text/plain"}, content=b"x"
        )
        assert response.status_code == 403, method
        assert response.json()["error"]["code"] == "origin_not_allowed"
        assert "access-control-allow-origin" not in response.headers, method
        assert response.headers["x-content-type-options"] == "nosniff"
    claim = await client.post(
        "/v1/stream/__ds/subscriptions/g/claim", headers={"origin": OTHER, "content-type": "text/plain"},
        content=b'{"worker": "page"}',
    )  # fmt: skip
    assert claim.status_code == 403
    assert (await client.get("/v1/stream/cors-write", params={"offset": "-1"})).content == b"kept"


async def test_a_page_of_the_nodes_own_origin_may_write(client: httpx.AsyncClient) -> None:
    """The console is served by the node itself: its writes are same-origin, whichever loopback name
    the browser used; the node listens on 127.0.0.1:4437 here."""
    for origin in ("http://127.0.0.1:4437", "http://localhost:4437", "http://[::1]:4437"):
        own = {"origin": origin, "content-type": "text/plain"}
        assert (await client.put("/v1/stream/cors-own", headers=own, content=b"a")).status_code in (200, 201)
        assert (await client.post("/v1/stream/cors-own", headers=own, content=b"b")).status_code == 204, origin
    for origin in ("http://localhost:8080", "https://127.0.0.1:4437"):
        other = {"origin": origin, "content-type": "text/plain"}
        assert (await client.post("/v1/stream/cors-own", headers=other, content=b"c")).status_code == 403, origin


async def test_a_host_header_does_not_make_an_origin_the_nodes_own(client: httpx.AsyncClient) -> None:
    """DNS rebinding: a page of evil.example, its name re-pointed at this machine, sends both."""
    rebound = {"origin": "http://evil.example:4437", "host": "evil.example:4437", "content-type": "text/plain"}
    assert (await client.put("/v1/stream/cors-rebound", headers=rebound, content=b"x")).status_code == 403
    assert (await client.head("/v1/stream/cors-rebound")).status_code == 404


async def test_a_refused_preflight_is_a_json_error(client: httpx.AsyncClient) -> None:
    for asked in (preflight(OTHER, "POST"), preflight(OTHER, "GET", "authorization"), preflight(LISTED, "PATCH")):
        response = await client.options("/v1/stream/x", headers=asked)
        assert response.status_code == 400
        assert response.json()["error"]["code"] == "cors_preflight_refused"
        assert "access-control-allow-origin" not in response.headers


async def test_any_origin_may_read(client: httpx.AsyncClient) -> None:
    await client.put("/v1/stream/cors-read", headers={"content-type": "text/plain"}, content=b"hello")
    check = await client.options("/v1/stream/cors-read", headers=preflight(OTHER, "GET", "if-none-match"))
    assert check.status_code == 200
    assert check.headers["access-control-allow-origin"] == "*"
    assert "if-none-match" in allowed_headers(check)
    assert "authorization" not in allowed_headers(check)  # tokens only from listed origins
    assert not methods(check) & set(WRITES)
    for method in ("GET", "HEAD"):
        response = await client.request(method, "/v1/stream/cors-read", headers={"origin": OTHER})
        assert response.status_code == 200
        assert response.headers["access-control-allow-origin"] == "*"
        exposed = {h.strip().lower() for h in response.headers["access-control-expose-headers"].split(",")}
        assert {"stream-next-offset", "etag", "www-authenticate"} <= exposed
    live = await client.get("/v1/stream/cors-read?offset=-1&live=sse", headers={"origin": OTHER})
    assert live.headers["access-control-allow-origin"] == "*"


async def test_a_listed_origin_may_write_with_a_token(client: httpx.AsyncClient) -> None:
    asked = "authorization, content-type, stream-seq, producer-id, producer-epoch, producer-seq, stream-ttl"
    for method in WRITES:
        response = await client.options("/ds/b/s", headers=preflight(LISTED, method, asked))
        assert response.status_code == 200, response.text
        assert response.headers["access-control-allow-origin"] == LISTED
        assert method in methods(response)
        assert set(asked.split(", ")) <= allowed_headers(response)
        assert response.headers["x-content-type-options"] == "nosniff"
    created = await client.put("/v1/stream/cors-listed", headers={"origin": LISTED, "content-type": "text/plain"})
    assert created.status_code == 201
    assert created.headers["access-control-allow-origin"] == LISTED
    assert "origin" in created.headers["vary"].lower()
    assert "location" in created.headers["access-control-expose-headers"].lower()


async def test_a_listed_star_lets_every_origin_write(any_origin: httpx.AsyncClient) -> None:
    response = await any_origin.options("/ds/b/s", headers=preflight(OTHER, "DELETE", "authorization"))
    assert response.status_code == 200
    assert response.headers["access-control-allow-origin"] == "*"
    assert "DELETE" in methods(response)
    assert "authorization" in allowed_headers(response)  # `*` would not cover it: it is listed


async def test_requests_without_origin_get_no_cors_headers(client: httpx.AsyncClient) -> None:
    response = await client.put("/v1/stream/cors-none", headers={"content-type": "text/plain"})
    assert response.status_code == 201
    assert not any(name.startswith("access-control-") for name in response.headers)
