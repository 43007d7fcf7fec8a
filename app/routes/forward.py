"""Proxying a write from a follower to the leader (`--forward-writes`), for clients that cannot
re-send a body on a 307 (Node's fetch cannot, for binary bodies).

Requests go over the raw keep-alive client of app/cluster/peer_client.py (httpx costs about a
millisecond of CPU per request, which a follower forwarding every write cannot spare), one request at
a time per connection, with idle connections kept for reuse. A leader that does not answer in time,
answers past the client's size cap or not in HTTP gets the client a retryable 503.
"""

from __future__ import annotations

import ssl
import time

from app.cluster.peer_client import Connection, connect, encode_request
from app.protocol.bodies import read_body
from app.protocol.errors import error_reply
from app.protocol.http import Call, Reply
from app.protocol.leader import leader_target
from app.service.budget import BodyBudget

# Set per hop, or by send_reply for every response: never copied across.
_HOP = {"host", "content-length", "connection", "keep-alive", "transfer-encoding", "upgrade", "te", "trailer"}
_OURS = _HOP | {"date", "server", "x-content-type-options", "cross-origin-resource-policy"}
IDLE_SECONDS = 4.0  # under uvicorn's 5 s keep-alive timeout, so a reused connection is still open
TIMEOUT_SECONDS = 30.0
CONNECT_SECONDS = 2.0


class Forwarder:
    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self._idle: dict[str, list[tuple[float, Connection]]] = {}
        self.tls = tls  # for an https:// leader (default: the system's CAs)

    async def forward(
        self,
        call: Call,
        leader: str,
        max_body: int,
        budget: BodyBudget | None = None,
        body: bytes | None = None,
        timeout: float = TIMEOUT_SECONDS,
    ) -> Reply:
        """The leader's answer to the request; `body` if the caller already read it."""
        if body is None:
            body = await read_body(call, max_body, budget)
        headers = {k: v for k, v in call.headers.items() if k not in _HOP}
        # The client's Host goes along, so URLs the leader builds (Location, subscriptions' callback
        # and JWKS URLs) name the node the client reached, as they would without forwarding.
        raw = encode_request(call.method, leader_target(leader, call.scope), headers, body, call.headers.get("host"))
        conn = self._take(leader)
        try:
            if conn is None:
                conn = await connect(leader, self.tls, CONNECT_SECONDS)
            response = await conn.request(raw, timeout)
        except Exception:  # noqa: BLE001 - whatever failed, the client gets a retryable answer
            if conn is not None:
                conn.close()
            return error_reply(503, "leader_unreachable", "the leader did not answer; retry", {"retry-after": "1"})
        if conn.is_open:  # the client closes one the leader answered with `Connection: close`
            self._idle.setdefault(leader, []).append((time.monotonic(), conn))
        kept = {k: v for k, v in response.headers if k not in _OURS}
        return Reply(response.status, kept, response.body)

    def _take(self, leader: str) -> Connection | None:
        idle = self._idle.get(leader, [])
        now = time.monotonic()
        while idle:
            since, conn = idle.pop()
            if now - since < IDLE_SECONDS and conn.is_open:  # the leader may have closed it sooner
                return conn
            conn.close()
        return None

    async def close(self) -> None:
        for idle in self._idle.values():
            for _, conn in idle:
                conn.close()
        self._idle.clear()
