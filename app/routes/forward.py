"""Proxying a write from a follower to the leader (`--forward-writes`), for clients that cannot
re-send a body on a 307 (Node's fetch cannot, for binary bodies)."""

from __future__ import annotations

import httpx
from starlette.types import Scope

from app.protocol.bodies import read_body
from app.protocol.errors import error_reply
from app.protocol.http import Call, Reply

# Set per hop, or by send_reply for every response: never copied across.
_HOP = {"host", "content-length", "connection", "keep-alive", "transfer-encoding", "upgrade", "te", "trailer"}
_OURS = _HOP | {"date", "server", "x-content-type-options", "cross-origin-resource-policy"}


class Forwarder:
    def __init__(self) -> None:
        self._client: httpx.AsyncClient | None = None

    async def forward(self, call: Call, leader: str, max_body: int) -> Reply:
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=httpx.Timeout(30.0))
        body = await read_body(call, max_body)
        headers = [(k, v) for k, v in call.headers.items() if k not in _HOP]
        try:
            response = await self._client.request(
                call.method, leader_target(leader, call.scope), headers=headers, content=body
            )
        except httpx.HTTPError:
            return error_reply(503, "leader_unreachable", "the leader did not answer; retry", {"retry-after": "1"})
        kept = {k: v for k, v in response.headers.items() if k.lower() not in _OURS}
        return Reply(response.status_code, kept, response.content)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()


def leader_target(leader: str, scope: Scope) -> str:
    """The same path and query on the leader, as the client sent them."""
    query = scope.get("query_string", b"")
    path = scope.get("raw_path", b"").decode("latin-1")
    return leader + path + ("?" + query.decode("latin-1") if query else "")
