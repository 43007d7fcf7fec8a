"""Location headers come from `public_url` when it is set, never from the request's Host."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from tests.inprocess import node_client

pytestmark = pytest.mark.anyio

PUBLIC = "https://streams.example.com/rill"
SPOOFED = {"host": "evil.example"}
TEXT = {"content-type": "text/plain"}


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
async def public(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[httpx.AsyncClient]:
    async with node_client(tmp_path_factory.mktemp("public-url"), public_url=PUBLIC + "/") as c:
        yield c


@pytest.fixture(scope="module")
async def plain(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[httpx.AsyncClient]:
    async with node_client(tmp_path_factory.mktemp("no-public-url")) as c:
        yield c


async def _snapshot_redirect(client: httpx.AsyncClient) -> httpx.Response:
    assert (await client.put("/ds/snaps")).status_code == 201
    created = await client.put("/ds/snaps/s", headers=TEXT, content=b"hello")
    offset = created.headers["stream-next-offset"]
    published = await client.put(f"/ds/snaps/s/snapshot/{offset}", headers=TEXT, content=b"state")
    assert published.status_code == 201, published.text
    return await client.get("/ds/snaps/s/snapshot", headers=SPOOFED)


@pytest.mark.parametrize("path", ["/v1/stream/a%20b", "/streams/loc", "/ds/locs/loc"])
async def test_create_location_is_under_public_url(public: httpx.AsyncClient, path: str) -> None:
    if path.startswith("/ds/"):
        assert (await public.put("/ds/locs")).status_code == 201
    response = await public.put(path, headers={**TEXT, **SPOOFED})
    assert response.status_code == 201, response.text
    assert response.headers["location"] == PUBLIC + path


async def test_snapshot_redirect_is_under_public_url(public: httpx.AsyncClient) -> None:
    response = await _snapshot_redirect(public)
    assert response.status_code == 307
    assert response.headers["location"].startswith(PUBLIC + "/ds/snaps/s/snapshot/")


async def test_without_public_url_location_follows_the_request(plain: httpx.AsyncClient) -> None:
    response = await plain.put("/v1/stream/loc", headers={**TEXT, **SPOOFED})
    assert response.headers["location"] == "http://evil.example/v1/stream/loc"
    redirect = await _snapshot_redirect(plain)
    assert redirect.status_code == 307
    assert redirect.headers["location"].startswith("/ds/snaps/s/snapshot/")
