"""Live reads end when the reader's token does: a long-poll returns by then, not after its 20 s
timeout, and an SSE response sends a last `event: control` and closes, not after its 60 s.

These run on real time, with tokens that expire a second or two after the request starts.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from app.security.authenticator import AuthSettings
from app.security.tokens import new_token
from tests.inprocess import Node, client_for, running_node
from tests.security.helpers import (
    PRIVATE,
    TOKENS,
    SigningKeys,
    assert_unauthorized,
    bearer,
    jwt_config,
    mint,
    token_configs,
)

pytestmark = pytest.mark.anyio

LIFETIME = 2.0  # seconds the expiring opaque token lives after the node starts
SOON = new_token()


@dataclass(frozen=True)
class LiveNode:
    node: Node
    soon_expires: float  # when SOON expires, in seconds since the epoch

    def remaining(self) -> float:
        left = self.soon_expires - time.time()
        assert left > 0.5, "the node took too long to start"
        return left


@pytest.fixture()
async def live(jwks_file: Path, tmp_path: Path) -> AsyncIterator[LiveNode]:
    """Auth on, long-polls wait 20 s and SSE responses last 60 s; `SOON` may read acme for LIFETIME."""
    soon = datetime.now(UTC) + timedelta(seconds=LIFETIME)
    roles = {"root": (["admin:*"], None), "soon": ([f"read:{PRIVATE}"], soon)}
    auth = AuthSettings(mode="on", tokens=token_configs(roles, {"root": TOKENS["root"], "soon": SOON}))
    auth.jwt = jwt_config(jwks_file)
    async with running_node(tmp_path, auth=auth, long_poll_timeout=20, sse_max_seconds=60) as node:
        async with client_for(node) as client:
            assert (await client.put(f"/ds/{PRIVATE}", headers=bearer(TOKENS["root"]))).status_code == 201
        yield LiveNode(node, soon.timestamp())


async def stream_with(client: httpx.AsyncClient, body: bytes) -> tuple[str, str]:
    """A text stream in acme holding `body`: (its path, its tail)."""
    path = f"/ds/{PRIVATE}/live-{time.monotonic_ns()}"
    root = {**bearer(TOKENS["root"]), "content-type": "text/plain"}
    resp = await client.put(path, content=body, headers=root)
    assert resp.status_code == 201, resp.text
    return path, resp.headers["stream-next-offset"]


def events(text: str) -> list[tuple[str, str]]:
    """(event, data) of each SSE event; comments (pings) are skipped."""
    found = []
    for block in text.split("\n\n"):
        lines = [line for line in block.split("\n") if line and not line.startswith(":")]
        if not lines:
            continue
        name = next(line[6:].strip() for line in lines if line.startswith("event:"))
        data = "\n".join(line[5:] for line in lines if line.startswith("data:"))
        found.append((name, data))
    return found


async def test_long_poll_ends_when_an_opaque_token_expires(live: LiveNode) -> None:
    async with client_for(live.node) as client:
        path, tail = await stream_with(client, b"abc")
        remaining = live.remaining()
        started = time.monotonic()
        resp = await client.get(path, params={"offset": tail, "live": "long-poll"}, headers=bearer(SOON))
        elapsed = time.monotonic() - started
        assert resp.status_code == 204, resp.text
        assert resp.headers["stream-next-offset"] == tail
        assert resp.headers["stream-up-to-date"] == "true"
        assert remaining - 0.3 <= elapsed <= remaining + 1.5, (elapsed, remaining)
        # And from then on the token is refused.
        after = await client.get(path, params={"offset": tail, "live": "long-poll"}, headers=bearer(SOON))
        assert_unauthorized(after, invalid=True)
        assert after.headers["www-authenticate"].endswith('error_description="the token has expired"')


async def test_long_poll_ends_when_a_jwt_expires(live: LiveNode, keys: SigningKeys) -> None:
    exp = int(time.time()) + 2
    token = mint(keys.rsa, exp=exp, scope=f"read:{PRIVATE}")
    async with client_for(live.node) as client:
        path, tail = await stream_with(client, b"")
        started = time.monotonic()
        resp = await client.get(path, params={"offset": tail, "live": "long-poll"}, headers=bearer(token))
        elapsed = time.monotonic() - started
        remaining = exp - (time.time() - elapsed)
        assert resp.status_code == 204, resp.text
        assert remaining - 0.3 <= elapsed <= remaining + 1.5, (elapsed, remaining)


async def test_long_poll_with_a_lasting_token_waits_for_data(live: LiveNode) -> None:
    """The contrast: a token that does not expire soon is held until an append wakes it."""
    async with client_for(live.node) as client:
        path, tail = await stream_with(client, b"a")
        root = bearer(TOKENS["root"])

        async def append_later() -> None:
            await asyncio.sleep(0.5)
            await client.post(path, content=b"b", headers={**root, "content-type": "text/plain"})

        task = asyncio.create_task(append_later())
        started = time.monotonic()
        resp = await client.get(path, params={"offset": tail, "live": "long-poll"}, headers=root)
        await task
        assert resp.status_code == 200 and resp.content == b"b"
        assert 0.4 <= time.monotonic() - started < 5
        # private data: a shared cache must not keep it
        assert resp.headers["cache-control"].startswith("private, ")


async def test_sse_ends_with_a_control_event_when_an_opaque_token_expires(live: LiveNode) -> None:
    async with client_for(live.node) as client:
        path, tail = await stream_with(client, b"abc")
        remaining = live.remaining()
        started = time.monotonic()
        resp = await client.get(path, params={"offset": "-1", "live": "sse"}, headers=bearer(SOON))
        elapsed = time.monotonic() - started
        assert resp.status_code == 200
        assert resp.headers["content-type"] == "text/event-stream"
        assert remaining - 0.3 <= elapsed <= remaining + 1.5, (elapsed, remaining)
        got = events(resp.text)
        assert [name for name, _ in got] == ["data", "control", "control"], resp.text
        assert got[0][1] == "abc"
        first, last = json.loads(got[1][1]), json.loads(got[2][1])
        assert first["streamNextOffset"] == tail and first["upToDate"] is True
        # The last control tells the client where to resume (with a new token); the stream is not closed.
        assert last["streamNextOffset"] == tail
        assert "streamCursor" in last and "streamClosed" not in last


async def test_sse_ends_with_a_control_event_when_a_jwt_expires(live: LiveNode, keys: SigningKeys) -> None:
    exp = int(time.time()) + 2
    token = mint(keys.ec, kid="ec-1", alg="ES256", exp=exp, scp=[f"read:{PRIVATE}"])
    async with client_for(live.node) as client:
        path, tail = await stream_with(client, b"")
        root = {**bearer(TOKENS["root"]), "content-type": "text/plain"}

        async def append_later() -> str:
            await asyncio.sleep(0.3)
            resp = await client.post(path, content=b"late", headers=root)
            return resp.headers["stream-next-offset"]

        task = asyncio.create_task(append_later())
        started = time.monotonic()
        resp = await client.get(path, params={"offset": tail, "live": "sse"}, headers=bearer(token))
        elapsed = time.monotonic() - started
        new_tail = await task
        remaining = exp - (time.time() - elapsed)
        assert resp.status_code == 200
        assert remaining - 0.3 <= elapsed <= remaining + 1.5, (elapsed, remaining)
        got = events(resp.text)
        assert [name for name, _ in got] == ["control", "data", "control", "control"], resp.text
        assert got[1][1] == "late"
        assert json.loads(got[-1][1])["streamNextOffset"] == new_tail
