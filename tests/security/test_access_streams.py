"""Access to streams in all three route families, on a node with auth on: every method, every case.

For each request: no token (401 and the bare challenge), an expired opaque token and a JWT for
another audience (401, invalid_token), a token for another bucket (404, the very answer a missing
bucket or stream gets), a read-only token on a write (403), a token of exactly the level needed
(success), and in /ds without a token on the public_read bucket (reads succeed, writes 401).
A refused request must leave the stores untouched.
"""

from __future__ import annotations

import httpx
import pytest

from app.security.scopes import Action
from tests.inprocess import Node
from tests.security.helpers import TOKENS, Op, SigningKeys, World, bearer, cases_for, check_case

pytestmark = pytest.mark.anyio

R, W = Action.READ, Action.WRITE
FAMILIES = ("ds", "legacy", "compat")


def stream_ops(family: str) -> list[Op]:
    # In the built-in buckets a PUT by an all-powerful token would create the missing stream: the
    # answer to compare with is then a GET of it.
    create_reference = None if family == "ds" else ("GET", "{base}{stream}")
    return [
        Op("create", "PUT", "{base}{new}", W, 201, content_type="text/plain", reference=create_reference),
        Op("append", "POST", "{base}{stream}", W, 204, b"d", "text/plain"),
        Op("read", "GET", "{base}{stream}", R, 200, query="offset=-1"),
        Op("head", "HEAD", "{base}{stream}", R, 200),
        Op("delete", "DELETE", "{base}{stream}", W, 204),
        Op("long-poll", "GET", "{base}{stream}", R, 200, query="offset=-1&live=long-poll"),
        Op("sse", "GET", "{base}{stream}", R, 200, query="offset=-1&live=sse"),
    ]


def matrix() -> list[object]:
    params: list[object] = []
    for family in FAMILIES:
        for op in stream_ops(family):
            for case in cases_for(op, family):
                params.append(pytest.param(family, op, case, id=f"{family}-{op.id}-{case}"))
    return params


async def verify(client: httpx.AsyncClient, world: World, resp: httpx.Response, op: Op) -> None:
    """What a permitted request did, seen through an all-powerful token."""
    root = bearer(TOKENS["root"])
    if op.id == "create":
        assert (await client.head(resp.headers["location"], headers=root)).status_code == 200
    elif op.id == "append":
        read = await client.get(world.base + world.stream, params={"offset": "-1"}, headers=root)
        assert read.content == b"abcd"
        assert resp.headers["stream-next-offset"] > world.offsets[-1]
    elif op.id in ("read", "long-poll"):
        assert resp.content == b"abc"
        assert resp.headers["stream-next-offset"] == world.offsets[-1]
    elif op.id == "head":
        assert resp.headers["stream-next-offset"] == world.offsets[-1]
        assert resp.headers["content-type"] == "text/plain"
    elif op.id == "delete":
        gone = await client.get(world.base + world.stream, params={"offset": "-1"}, headers=root)
        assert gone.status_code == 404
    elif op.id == "sse":
        assert resp.headers["content-type"] == "text/event-stream"
        assert resp.text.startswith("event: data\ndata:abc\n\nevent: control\n"), resp.text
    else:
        raise AssertionError(op.id)


@pytest.mark.parametrize(("family", "op", "case"), matrix())
async def test_stream_access(
    client: httpx.AsyncClient, auth_node: Node, keys: SigningKeys, family: str, op: Op, case: str
) -> None:
    async def check(client: httpx.AsyncClient, world: World, resp: httpx.Response) -> None:
        await verify(client, world, resp, op)

    await check_case(client, auth_node, keys, family, op, case, check)


def test_the_matrix_covers_every_stream_method() -> None:
    for family in FAMILIES:
        ops = stream_ops(family)
        assert {op.method for op in ops} == {"PUT", "POST", "GET", "HEAD", "DELETE"}
        assert {op.query for op in ops} >= {"offset=-1&live=long-poll", "offset=-1&live=sse"}
    ids = {p.id for p in matrix()}  # type: ignore[attr-defined]
    assert "compat-delete-read-only" in ids and "ds-sse-public" in ids and "legacy-read-public" not in ids
