"""Cross-origin rules: any origin may read (public buckets, EventSource); only the origins in
`cors_origins` (and a page of the server's own origin) may write or send a token.

A browser sends a "simple" cross-origin POST (text/plain, no custom header) without asking first,
so refusing its preflights is not enough: a write from any other origin is refused before it runs,
or any page a user visits could append to a server without auth on their machine.

Only browser requests carry Origin; the rest skip the CORS wrappers' per-message work.
"""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

from app.protocol.errors import error_reply
from app.protocol.http import send_reply, with_security_headers

EXPOSED_HEADERS = [
    "Stream-Next-Offset",
    "Stream-Cursor",
    "Stream-Up-To-Date",
    "Stream-Closed",
    "Stream-TTL",
    "Stream-Expires-At",
    "Stream-SSE-Data-Encoding",
    "Producer-Epoch",
    "Producer-Seq",
    "Producer-Expected-Seq",
    "Producer-Received-Seq",
    "ETag",
    "Location",
    "Content-Type",
    "Retry-After",
    "Stream-Earliest-Offset",
    "Stream-Snapshot-Offset",
    "Stream-Snapshot-Digest",
    "Stream-Retention",
    "WWW-Authenticate",
]
# Request headers a cross-origin page may send.
READ_REQUEST_HEADERS = ["If-None-Match", "Last-Event-ID"]
WRITE_REQUEST_HEADERS = [
    "Authorization",
    "Stream-TTL",
    "Stream-Expires-At",
    "Stream-Seq",
    "Stream-Closed",
    "Stream-Attrs",
    "Stream-Retention",
    "Stream-Forked-From",
    "Stream-Fork-Offset",
    "Stream-Fork-Sub-Offset",
    "Stream-Snapshot-Match",
    "Producer-Id",
    "Producer-Epoch",
    "Producer-Seq",
]
_READ_METHODS = ("GET", "HEAD", "OPTIONS")


class Cors:
    """Listed origins (or `*` listed) get every method, a token and the protocol's headers; any other
    origin only reads: its writes are refused (403), and so are its preflights for them (400)."""

    def __init__(self, app: ASGIApp, origins: list[str], own: frozenset[str] = frozenset()) -> None:
        self.app = app
        self.own = own  # the node's own pages' origins (app/service/build.py: own_origins)
        self.trusted = CORSMiddleware(
            app,
            allow_origins=origins,
            allow_methods=["GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS"],
            allow_headers=READ_REQUEST_HEADERS + WRITE_REQUEST_HEADERS,
            expose_headers=EXPOSED_HEADERS,
            max_age=86400,
        )
        self.reads = CORSMiddleware(
            app,
            allow_origins=["*"],
            allow_methods=_READ_METHODS,
            allow_headers=READ_REQUEST_HEADERS,
            expose_headers=EXPOSED_HEADERS,
            max_age=86400,
        )

    def _for(self, scope: Scope, origin: str) -> CORSMiddleware | None:
        """The rules for a request from `origin`; None for a write it may not make."""
        if self.trusted.is_allowed_origin(origin):
            return self.trusted
        method = scope["method"]
        if method == "OPTIONS":  # a preflight asks for the method it would send
            method = _asked_method(scope) or "OPTIONS"
        return self.reads if method in _READ_METHODS else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            for name, value in scope["headers"]:
                if name == b"origin":
                    await self._cross_origin(scope, receive, send, value.decode("latin-1"))
                    return
        await self.app(scope, receive, send)

    async def _cross_origin(self, scope: Scope, receive: Receive, send: Send, origin: str) -> None:
        preflight = scope["method"] == "OPTIONS" and _asked_method(scope) is not None
        chosen = self._for(scope, origin)
        if preflight:
            await self._preflight(scope, receive, send, chosen)
        elif chosen is not None:
            await chosen(scope, receive, with_security_headers(send))
        elif origin.lower() in self.own:
            await self.app(scope, receive, send)  # the server's own pages (the console): not cross-origin
        else:
            message = f"a page from {origin[:200]} may not write here: list its origin in cors_origins"
            await send_reply(send, error_reply(403, "origin_not_allowed", message))

    async def _preflight(self, scope: Scope, receive: Receive, send: Send, chosen: CORSMiddleware | None) -> None:
        if chosen is None:
            message = "this origin may only read (GET, HEAD): list it in cors_origins to write or send a token"
            await send_reply(send, error_reply(400, "cors_preflight_refused", message))
            return
        response = chosen.preflight_response(request_headers=Headers(scope=scope))
        if response.status_code != 200:  # a method or header it may not use: Starlette's reason, as JSON
            message = f"preflight refused: {bytes(response.body).decode(errors='replace')}"
            await send_reply(send, error_reply(400, "cors_preflight_refused", message))
            return
        await response(scope, receive, with_security_headers(send))


def _asked_method(scope: Scope) -> str | None:
    asked = next((v for n, v in scope["headers"] if n == b"access-control-request-method"), None)
    return None if asked is None else asked.decode("latin-1")
