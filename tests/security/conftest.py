"""Fixtures of the security tests: signing keys and their JWKS, and one in-process node with auth on.

The node admits the opaque tokens of `helpers.ROLES` and JWTs signed by `keys`; `open` is its
public_read bucket. Its long-poll timeout is the usual 20 s (a live read that ends sooner ended for
another reason); SSE responses end after half a second so a successful SSE read finishes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

pytest.register_assert_rewrite("tests.security.helpers")  # its checks report the values they compare

from app.security.authenticator import AuthSettings  # noqa: E402
from tests.inprocess import (  # noqa: E402
    Node,  # noqa: E402
    client_for,
    running_node,
)
from tests.security.helpers import (  # noqa: E402
    OTHER,
    PRIVATE,
    PUBLIC,
    ROLES,
    TOKENS,
    SigningKeys,
    bearer,
    jwt_config,
    make_keys,
    token_configs,
    write_jwks,
)


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"  # the node's Raft driver and engine are asyncio code


@pytest.fixture(scope="session")
def keys() -> SigningKeys:
    return make_keys()


@pytest.fixture(scope="session")
def jwks_file(keys: SigningKeys, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_jwks(tmp_path_factory.mktemp("jwks") / "jwks.json", keys.jwks())


@pytest.fixture(scope="module")
async def auth_node(jwks_file: Path, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Node]:
    auth = AuthSettings(mode="on", tokens=token_configs(ROLES, TOKENS), jwt=jwt_config(jwks_file), public_read=[PUBLIC])
    root = tmp_path_factory.mktemp("auth-node")
    async with running_node(root, auth=auth, long_poll_timeout=20, sse_max_seconds=0.5) as node:
        async with client_for(node) as client:
            for bucket in (PRIVATE, OTHER, PUBLIC):
                resp = await client.put(f"/ds/{bucket}", headers=bearer(TOKENS["root"]))
                assert resp.status_code == 201, resp.text
        yield node


@pytest.fixture()
async def client(auth_node: Node) -> AsyncIterator[httpx.AsyncClient]:
    """Overrides the session server's `client`: requests go to the in-process auth node."""
    async with client_for(auth_node) as c:
        yield c
