"""Route families: thin adapters that name a stream and hand the request to the protocol core.

Stream paths are matched by prefix here, ahead of Starlette's router, so the
hot path pays for no framework machinery; everything else falls through to
the Starlette application.
"""

from __future__ import annotations

import contextlib
import functools
import logging

from starlette.applications import Starlette
from starlette.types import Receive, Scope, Send

from app.domain.errors import LeaderOnly, ProtocolError, missing_bucket, missing_stream
from app.domain.paths import BUCKET_LIST, DS_PREFIX
from app.protocol.buckets import serve_bucket, serve_bucket_list
from app.protocol.errors import error_reply, render_error
from app.protocol.extensions import Extension, serve_extension
from app.protocol.fanout import Fanout
from app.protocol.http import Call, send_reply, with_security_headers
from app.protocol.leader import leader_redirect
from app.protocol.streams import serve_stream
from app.protocol.subscriptions import LEASE_AUTHORIZED, serve_control
from app.protocol.subscriptions import MAX_BODY as CONTROL_MAX_BODY
from app.protocol.target import ControlTarget, StreamTarget, decode_path
from app.routes import compat, ds, legacy
from app.routes.forward import Forwarder
from app.security.authenticator import Authenticator, unauthorized
from app.security.policy import action_for, authorize
from app.security.scopes import ANY_BUCKET, Action, Principal
from app.service.engine import Engine
from app.state_machine.table import BUILTIN_BUCKETS

log = logging.getLogger("rill.http")


_WRITES = ("PUT", "POST", "DELETE")


_BUILTIN = (compat.family, legacy.family)
_PREFIXES = (DS_PREFIX, compat.family.prefix, legacy.family.prefix)
_BUCKET_LIST = (BUCKET_LIST, DS_PREFIX)


class StreamRoutes:
    """The stream paths of every family; anything else goes to `fallback` (Starlette's router)."""

    def __init__(self, engine: Engine, auth: Authenticator, forwarder: Forwarder, fallback: Starlette) -> None:
        self.engine = engine
        self.auth = auth
        self.forwarder = forwarder
        self.fallback = fallback
        self.fanout = Fanout(engine)  # the live SSE readers at each stream's tail

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.fallback(scope, receive, send)
            return
        if not scope["path"].startswith(_PREFIXES) and scope["path"] != BUCKET_LIST:
            await self.fallback(scope, receive, with_security_headers(send))
            return
        call = Call.from_scope(scope, receive)
        try:
            await self._serve(call, send)
        except Exception:
            # Never a bare 500: log it and answer in the protocol's error shape if we still can.
            # %r: a path may hold CR/LF, which must not start a forged log line.
            log.exception("unhandled error on %s %r", scope["method"], scope["path"])
            with contextlib.suppress(Exception):
                await send_reply(send, error_reply(500, "internal_error", "internal server error"))
        finally:
            if call.held:
                self.engine.body_budget.give_back(call.held)

    async def _serve(self, call: Call, send: Send) -> None:
        scope = call.scope
        engine = self.engine
        head_only = call.method == "HEAD"
        if scope["path"] in _BUCKET_LIST:
            await self._list_buckets(call, send)
            return
        try:
            target = _target(scope)
            if self.auth.enabled:
                await self._authorize(call, target)
        except ProtocolError as exc:
            await send_reply(send, render_error(exc), head_only=head_only)
            return
        if engine.clustered and call.method in _WRITES and await engine.led_elsewhere():
            # Writes go to the leader; reads are served here (tail answers after a ReadIndex barrier).
            leader = engine.leader_url()
            route = engine.leader_route()
            if route is not None and engine.forward_writes:
                # A subscription's control body is small (and an ack is checked against its lease's
                # token only by the leader): forwarding reads no more than the leader would take.
                limit = CONTROL_MAX_BODY if isinstance(target, ControlTarget) else engine.limits.max_body_bytes
                try:
                    reply = await self.forwarder.forward(call, route, limit, engine.body_budget)
                except ProtocolError as exc:  # too large, over the budget, or the client left
                    reply = render_error(exc)
            else:
                reply = leader_redirect(leader, scope)
            await send_reply(send, reply, head_only=head_only)
            return
        try:
            if isinstance(target, str):
                await serve_bucket(engine, call, target, send)
            elif isinstance(target, ControlTarget):
                await serve_control(engine, call, target, send)
            elif isinstance(target, Extension):
                await serve_extension(engine, call, target, send)
            else:
                await serve_stream(engine, self.fanout, call, target, send)
        except LeaderOnly:
            await engine.led_elsewhere()  # a leader known meanwhile is named, not "no leader"
            await send_reply(send, leader_redirect(engine.leader_url(), scope), head_only=head_only)

    async def _list_buckets(self, call: Call, send: Send) -> None:
        """`GET /ds`: with auth on, the buckets the caller may read (a public one needs no token)."""
        try:
            principal = await self.auth.principal(call.headers) if self.auth.enabled else None
            if self.auth.enabled and principal is None and not self.auth.public_read:
                raise unauthorized("this needs a bearer token")
        except ProtocolError as exc:
            await send_reply(send, render_error(exc), head_only=call.method == "HEAD")
            return

        await serve_bucket_list(self.engine, call, self._readable(principal), send)

    def _readable(self, principal: Principal | None) -> frozenset[str] | None:
        """The buckets a caller may read, by name; None for all of them. Grants name buckets exactly,
        so unless one covers every bucket the listing walks this set, not every bucket there is."""
        if not self.auth.enabled or (principal is not None and principal.may(Action.READ, ANY_BUCKET)):
            return None
        granted = () if principal is None else (b for b in principal.grants if principal.may(Action.READ, b))
        return self.auth.public_read | frozenset(granted)

    async def _authorize(self, call: Call, target: StreamTarget | Extension | ControlTarget | str) -> None:
        """The one access check of every stream, bucket and sub-resource request."""
        if isinstance(target, ControlTarget) and (target.kind == "jwks" or target.kind in LEASE_AUTHORIZED):
            return  # public keys; and acks that carry their lease's own token (checked when applied)
        principal = await self.auth.principal(call.headers)
        if isinstance(target, str):
            bucket, kind = target, "bucket"
        elif isinstance(target, ControlTarget):
            bucket, kind = target.bucket, "subscription"
        elif isinstance(target, Extension):
            bucket, kind = target.target.bucket, target.kind
        else:
            bucket, kind = target.bucket, None
        public = bucket in self.auth.public_read
        authorize(principal, action_for(kind, call.method), bucket, public, _missing(bucket))
        call.expires_at = principal.expires_at if principal is not None else None
        call.private = not public


def _target(scope: Scope) -> StreamTarget | Extension | ControlTarget | str:
    """What a request names, from the path as the client sent it (strictly decoded, see decode_path)."""
    raw = scope.get("raw_path")
    if raw is None:
        return _path_target(scope["path"])
    return _raw_target(raw, scope["path"])


@functools.lru_cache(maxsize=4096)  # ids are at most 1 KiB: a few MiB at most
def _raw_target(raw: bytes, path: str) -> StreamTarget | Extension | ControlTarget | str:
    """Remembered per path: the same streams are named over and over (errors are not remembered)."""
    try:
        decoded = decode_path(raw)
    except ProtocolError:
        _path_target(path)  # a bad /ds bucket id is reported as one
        raise
    return _path_target(decoded)


def _path_target(path: str) -> StreamTarget | Extension | ControlTarget | str:
    """What a stream path names: a stream, a /ds sub-resource, or (a /ds bucket) the bucket's id."""
    if path.startswith(DS_PREFIX):
        return ds.target(path)
    family = next(f for f in _BUILTIN if path.startswith(f.prefix))
    return family.target(path)


def _missing(bucket: str) -> ProtocolError:
    """What a request into a bucket the caller may not see answers: the same as a missing one."""
    if bucket in BUILTIN_BUCKETS:
        return missing_stream()
    return missing_bucket(bucket)
