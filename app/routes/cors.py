"""Cross-origin rules: any origin may read (public buckets, EventSource); only the origins in
`cors_origins` may write or send a token.

Only browser requests carry Origin; the rest skip the CORS wrappers' per-message work.
"""

from __future__ import annotations

from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

from app.protocol.http import with_security_headers

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
    origin only reads. Preflights for a write from elsewhere, and the writes' responses, are not
    approved: no Access-Control-Allow-Origin."""

    def __init__(self, app: ASGIApp, origins: list[str]) -> None:
        self.app = app
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
        self.refused = CORSMiddleware(
            app, allow_origins=(), allow_methods=_READ_METHODS, allow_headers=READ_REQUEST_HEADERS
        )

    def _for(self, scope: Scope, origin: str) -> CORSMiddleware:
        if self.trusted.is_allowed_origin(origin):
            return self.trusted
        method = scope["method"]
        if method == "OPTIONS":  # a preflight asks for the method it would send
            asked = (v for n, v in scope["headers"] if n == b"access-control-request-method")
            method = next(asked, b"OPTIONS").decode("latin-1")
        return self.reads if method in _READ_METHODS else self.refused

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            for name, value in scope["headers"]:
                if name == b"origin":
                    await self._for(scope, value.decode("latin-1"))(scope, receive, with_security_headers(send))
                    return
        await self.app(scope, receive, send)
