"""Route families: thin adapters that name a stream and hand the request to the protocol core.

Stream paths are matched by prefix here, ahead of Starlette's router, so the
hot path pays for no framework machinery; everything else falls through to
the Starlette application.
"""

from __future__ import annotations

import contextlib
import logging

from starlette.applications import Starlette
from starlette.types import Receive, Scope, Send

from app.domain.errors import LeaderOnly, ProtocolError
from app.protocol.buckets import serve_bucket
from app.protocol.errors import error_reply, render_error
from app.protocol.extensions import Extension, serve_extension
from app.protocol.http import Call, send_reply, with_security_headers
from app.protocol.streams import serve_stream
from app.routes import compat, ds, legacy
from app.routes.forward import Forwarder, leader_redirect

log = logging.getLogger("rill.http")


_WRITES = ("PUT", "POST", "DELETE")


_BUILTIN = (compat.family, legacy.family)
_PREFIXES = (ds.PREFIX, compat.family.prefix, legacy.family.prefix)


class StreamRoutes:
    def __init__(self, fallback: Starlette) -> None:
        self.fallback = fallback
        self.forwarder = Forwarder()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.fallback(scope, receive, send)
            return
        if not scope["path"].startswith(_PREFIXES):
            await self.fallback(scope, receive, with_security_headers(send))
            return
        try:
            await self._serve(scope, receive, send)
        except Exception:
            # Never a bare 500: log it and answer in the protocol's error shape if we still can.
            log.exception("unhandled error on %s %s", scope["method"], scope["path"])
            with contextlib.suppress(Exception):
                await send_reply(send, error_reply(500, "internal_error", "internal server error"))

    async def _serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        call = Call.from_scope(scope, receive)
        engine = self.fallback.state.engine
        path = call.path
        if engine.clustered and call.method in _WRITES and not engine.node.is_leader:
            # Writes go to the leader; reads are served here (tail answers after a ReadIndex barrier).
            leader = engine.leader_url()
            if leader is not None and engine.forward_writes and call.method in _WRITES:
                reply = await self.forwarder.forward(call, leader, engine.limits.max_body_bytes)
            else:
                reply = leader_redirect(leader, scope)
            await send_reply(send, reply, head_only=call.method == "HEAD")
            return
        try:
            if path.startswith(ds.PREFIX):
                target = ds.target(path)
                if isinstance(target, str):
                    await serve_bucket(engine, call, target, send)
                    return
                if isinstance(target, Extension):
                    try:
                        await serve_extension(engine, call, target, send)
                    except LeaderOnly:
                        await send_reply(send, leader_redirect(engine.leader_url(), scope))
                    return
            else:
                family = next(f for f in _BUILTIN if path.startswith(f.prefix))
                target = family.target(path)
        except ProtocolError as exc:
            await send_reply(send, render_error(exc), head_only=call.method == "HEAD")
            return
        try:
            await serve_stream(engine, call, target, send)
        except LeaderOnly:
            await send_reply(send, leader_redirect(engine.leader_url(), scope), head_only=call.method == "HEAD")
