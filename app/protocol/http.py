"""A lean view of an ASGI HTTP request and a way to send replies, for the protocol's hot path.

Stream requests skip Starlette's router, request and response objects: at
ten thousand appends a second they cost more than the append itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, quote, urlsplit

from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from app.domain.headers import SECURITY_HEADERS

if TYPE_CHECKING:
    from app.service.engine import Engine


@dataclass(slots=True)
class Call:
    scope: Scope
    receive: Receive
    method: str
    path: str
    headers: dict[str, str]
    _query: dict[str, list[str]] | None = field(default=None)
    # Set by the access check: when the caller's credentials run out (ms), and whether the data
    # is private (shared caches must not keep it).
    expires_at: int | None = None
    private: bool = False
    held: int = 0  # bytes of the node's body budget this request holds until it ends

    @classmethod
    def from_scope(cls, scope: Scope, receive: Receive) -> Call:
        headers: dict[str, str] = {}
        for name, value in scope["headers"]:
            headers.setdefault(name.decode("latin-1"), value.decode("latin-1"))
        return cls(scope, receive, scope["method"], scope["path"], headers)

    @property
    def query(self) -> dict[str, list[str]]:
        if self._query is None:
            raw = self.scope.get("query_string", b"").decode("latin-1")
            self._query = parse_qs(raw, keep_blank_values=True) if raw else {}
        return self._query

    def url(self, base: str, members: Iterable[str] = ()) -> str:
        """The absolute URL of the request, without its query: under the node's `base` URL, or under
        the one of the cluster's `members` (their base URLs) whose host and port the Host header names.

        A follower forwarding a write keeps its client's Host, so the URL names the node the client
        reached. Any other Host is ignored: a client could otherwise have the node hand out (and
        store, and send to webhooks) URLs naming any host."""
        host = self.headers.get("host")
        if host:
            host = host.lower()
            for member in members:
                if member and urlsplit(member).netloc.lower() == host:
                    base = member.rstrip("/")
                    break
        # The path as the client sent it (percent-encoded), so the header stays ASCII.
        raw = self.scope.get("raw_path")
        path = raw.decode("latin-1") if raw else quote(self.path)
        return base + path


def absolute_url(call: Call, engine: Engine) -> str:
    """The request's URL as the node hands it out (Location, a subscription's root): under
    `public_url` when it is set, else under this node's base URL or the member's its Host names."""
    limits = engine.limits
    return call.url(limits.base_url, () if limits.public_url else engine.peers.values())


@dataclass(slots=True)
class Reply:
    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""


def to_response(reply: Reply) -> Response:
    """A Reply for handlers that run inside Starlette's router."""
    return Response(reply.body, reply.status, reply.headers)


def with_security_headers(send: Send) -> Send:
    """Wraps `send` so responses made elsewhere (Starlette, CORS preflights) carry the security headers."""

    async def sender(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = list(message.get("headers", []))
            if not any(name == b"x-content-type-options" for name, _ in headers):
                headers += SECURITY_HEADERS
            message["headers"] = headers
        await send(message)

    return sender


_NAMES: dict[str, bytes] = {}


def _name(header: str) -> bytes:
    encoded = _NAMES.get(header)
    if encoded is None:
        encoded = _NAMES[header] = header.encode("latin-1")
    return encoded


# A stream's bytes may be HTML or SVG a writer chose: a browser opening them renders them in a sandbox,
# an opaque origin without scripts' access to this one's (the console's token, its pages).
REPLY_HEADERS = [*SECURITY_HEADERS, (b"content-security-policy", b"sandbox")]


async def send_reply(send: Send, reply: Reply, head_only: bool = False) -> None:
    headers = [(_name(k), v.encode("latin-1")) for k, v in reply.headers.items()]
    headers += REPLY_HEADERS
    body = reply.body
    # A HEAD answered without the body a GET would have (a stream's metadata) states no length: 0 would be false.
    if reply.status != 204 and reply.status != 304 and (body or not head_only):
        headers.append((b"content-length", b"%d" % len(body)))
    await send({"type": "http.response.start", "status": reply.status, "headers": headers})
    await send({"type": "http.response.body", "body": b"" if head_only else body})


def watch_disconnect(receive: Receive) -> asyncio.Future[None]:
    """A future done when the client disconnects (the request's body is read and dropped meanwhile);
    cancel it when the response ends."""

    async def disconnected() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    return asyncio.ensure_future(disconnected())
