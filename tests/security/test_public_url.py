"""URLs the node hands out (Location headers, a subscription's callback and JWKS URLs) come from
`public_url` when it is set, else from the address the node listens on: never from the request's Host."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import httpx
import pytest

from app.config import Settings
from app.protocol.http import Call
from app.service.build import base_url
from tests.inprocess import node_client
from tests.subscriptions.test_http import Receiver

pytestmark = pytest.mark.anyio

PUBLIC = "https://streams.example.com/rill"
LISTEN = "http://127.0.0.1:4437"  # the in-process node's (default) host and port
SPOOFED = {"host": "evil.example"}
TEXT = {"content-type": "text/plain"}
WEBHOOKS = {"webhook_allowed_networks": ["127.0.0.1/32"]}  # the receiver below listens on loopback


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
async def public(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[httpx.AsyncClient]:
    async with node_client(tmp_path_factory.mktemp("public-url"), public_url=PUBLIC + "/", **WEBHOOKS) as c:
        yield c


@pytest.fixture(scope="module")
async def plain(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[httpx.AsyncClient]:
    async with node_client(tmp_path_factory.mktemp("no-public-url"), **WEBHOOKS) as c:
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


async def test_without_public_url_location_is_the_listen_address(plain: httpx.AsyncClient) -> None:
    response = await plain.put("/v1/stream/loc", headers={**TEXT, **SPOOFED})
    assert response.headers["location"] == LISTEN + "/v1/stream/loc"
    # The latest-snapshot redirect stays relative: it names the node whatever address the client used.
    redirect = await _snapshot_redirect(plain)
    assert redirect.status_code == 307
    assert redirect.headers["location"].startswith("/ds/snaps/s/snapshot/")


async def _delivered(receiver: Receiver, timeout: float = 10.0) -> dict[str, object]:
    """The first notification the receiver got (waiting without blocking the node's loop)."""
    for _ in range(int(timeout / 0.05)):
        if receiver.requests:
            return json.loads(receiver.requests[0][1])
        await asyncio.sleep(0.05)
    raise AssertionError("no webhook delivery")


async def _subscription_urls(client: httpx.AsyncClient, base: str) -> None:
    """A webhook subscription made with a forged Host: its JWKS URL and the callback URL its
    notification carries start with `base`."""
    receiver = Receiver([200])
    try:
        body = {"type": "webhook", "pattern": "hooked/*", "webhook": {"url": receiver.url}}
        created = await client.put("/v1/stream/__ds/subscriptions/spoof", json=body, headers=SPOOFED)
        assert created.status_code == 201, created.text
        assert created.json()["webhook"]["signing"]["jwks_url"] == base + "/v1/stream/__ds/jwks.json"
        assert (await client.put("/v1/stream/hooked/a", headers=TEXT, content=b"x")).status_code == 201
        notification = await _delivered(receiver)
        assert notification["callback_url"] == base + "/v1/stream/__ds/subscriptions/spoof/callback"
        fetched = await client.get("/v1/stream/__ds/subscriptions/spoof", headers=SPOOFED)
        assert "evil.example" not in fetched.text
    finally:
        receiver.close()


async def test_a_subscriptions_urls_are_under_public_url(public: httpx.AsyncClient) -> None:
    await _subscription_urls(public, PUBLIC)


async def test_without_public_url_a_subscriptions_urls_name_the_listen_address(plain: httpx.AsyncClient) -> None:
    await _subscription_urls(plain, LISTEN)


@pytest.mark.parametrize("path", ["/healthz/", "/metrics/", "/openapi.yaml/"])
async def test_no_redirect_is_built_from_host(plain: httpx.AsyncClient, path: str) -> None:
    response = await plain.get(path, headers=SPOOFED)  # Starlette once redirected to http://evil.example/healthz
    assert response.status_code == 404
    assert "evil.example" not in response.headers.get("location", "")


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ({"public_url": PUBLIC + "/", "peers": {1: "http://n1:4437"}}, PUBLIC),
        ({"peers": {1: "http://n1:4437/", 2: "http://n2:4437"}, "cluster_secret": "s"}, "http://n1:4437"),
        ({"host": "10.0.0.5", "port": 8080}, "http://10.0.0.5:8080"),
        ({"host": "::1", "port": 8080}, "http://[::1]:8080"),
        ({"tls_cert": "c.pem", "tls_key": "k.pem"}, "https://127.0.0.1:4437"),
    ],
)
def test_the_base_url_comes_from_the_configuration(settings: dict[str, object], expected: str) -> None:
    assert base_url(Settings.model_validate(settings)) == expected


def test_a_wildcard_listen_address_stands_for_the_host_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("socket.gethostname", lambda: "box")
    assert base_url(Settings.model_validate({"host": "0.0.0.0"})) == "http://box:4437"


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("127.0.0.1:4438", "http://127.0.0.1:4438/v1/stream/x"),  # a member: as a follower forwards its client's
        ("NODE3.example:443", "https://node3.example:443/v1/stream/x"),
        ("evil.example", "http://127.0.0.1:4437/v1/stream/x"),
        ("127.0.0.1:9999", "http://127.0.0.1:4437/v1/stream/x"),
        (None, "http://127.0.0.1:4437/v1/stream/x"),
    ],
)
def test_a_host_picks_only_among_the_members_urls(host: str | None, expected: str) -> None:
    members = ["http://127.0.0.1:4437", "http://127.0.0.1:4438/", "https://node3.example:443", ""]
    headers = [] if host is None else [(b"host", host.encode())]
    scope = {"method": "PUT", "path": "/v1/stream/x", "raw_path": b"/v1/stream/x", "headers": headers}
    call = Call.from_scope(scope, None)  # type: ignore[arg-type]
    assert call.url("http://127.0.0.1:4437", members) == expected
