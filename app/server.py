"""The ASGI application: routes, middleware, and the node's lifecycle (stores, Raft, engine)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import AsyncIterator
from pathlib import Path

from starlette.applications import Starlette
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from app.config import Settings
from app.protocol.engine import Engine, Limits
from app.protocol.errors import error_body
from app.protocol.http import with_security_headers
from app.protocol.live import Signals
from app.raft import log_store
from app.raft.log_store import LogStore
from app.raft_node import RaftNode
from app.raft_transport import AUTH_HEADER, Transport, verify
from app.raft_transport import PATH as TRANSPORT_PATH
from app.raft_transport import decode as decode_messages
from app.routes import StreamRoutes
from app.state_machine import records
from app.state_machine.machine import StateMachine
from app.storage.rocks import RocksKV

log = logging.getLogger("rill.server")

OPENAPI = Path(__file__).resolve().parent.parent / "openapi" / "rill.yaml"

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
]


async def healthz(request: Request) -> Response:
    engine = request.app.state.engine
    core = engine.node.core
    return JSONResponse(
        {
            "status": "ok",
            "node": core.id,
            "role": core.role.value,
            "term": core.term,
            "leader": core.leader or None,
            "commit": core.commit,
            "applied": core.applied,
            "last_index": core.last_index(),
            "peers": {str(node_id): url for node_id, url in engine.peers.items()},
        }
    )


async def raft_messages(request: Request) -> Response:
    """Raft traffic from the other nodes, accepted only with a valid signature."""
    engine = request.app.state.engine
    secret = request.app.state.cluster_secret
    body = await request.body()
    if not secret or not verify(secret, body, request.headers.get(AUTH_HEADER)):
        return _error(403, "forbidden", "not a signed message from this cluster")
    try:
        messages = decode_messages(body)
    except Exception:
        return _error(400, "bad_request", "undecodable Raft messages")
    for msg in messages:
        engine.node.receive(msg)
    return Response(status_code=204)


async def openapi(request: Request) -> Response:
    return FileResponse(OPENAPI, media_type="application/yaml")


def _error(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> Response:
    return Response(error_body(code, message), status, {**(headers or {}), "content-type": "application/json"})


async def not_found(request: Request, exc: Exception) -> Response:
    return _error(404, "not_found", "no such route")


async def method_not_allowed(request: Request, exc: Exception) -> Response:
    return _error(405, "method_not_allowed", f"{request.method} is not allowed here", getattr(exc, "headers", None))


async def server_error(request: Request, exc: Exception) -> Response:
    return _error(500, "internal_error", "internal server error")


def create_app(settings: Settings) -> ASGIApp:
    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        data_dir = Path(settings.data_dir)
        raft_kv = RocksKV(data_dir / "raft", log_store.COLUMN_FAMILIES)
        state_kv = RocksKV(data_dir / "state", records.COLUMN_FAMILIES)
        signals = Signals()
        machine = StateMachine(state_kv, on_change=signals.notify)
        voters = sorted(settings.peers) or [settings.node_id]
        secret = settings.cluster_secret.encode()
        transport = Transport(settings.node_id, settings.peers, secret) if settings.peers else None
        node = RaftNode(
            settings.node_id,
            voters,
            LogStore(raft_kv),
            machine,
            send=transport.send if transport else None,
            tick_seconds=settings.raft_tick_seconds,
        )
        app.state.cluster_secret = secret
        limits = Limits(
            max_body_bytes=settings.max_body_bytes,
            read_chunk_bytes=settings.read_chunk_bytes,
            long_poll_seconds=settings.long_poll_timeout,
            sse_max_seconds=settings.sse_max_seconds,
            sse_ping_seconds=settings.sse_ping_seconds,
        )
        engine = Engine(node, machine, signals, limits, settings.peers, settings.forward_writes)
        app.state.engine = engine
        await node.start()
        # Long-lived startup objects leave the collector's view, and young collections run less
        # often: request objects die by reference counting, and full passes cost p99 latency.
        gc.collect()
        gc.freeze()
        gc.set_threshold(20_000, 20, 100)
        sweeper = asyncio.create_task(engine.collect_expired_forever())
        try:
            yield
        finally:
            sweeper.cancel()
            if transport is not None and await node.transfer_leadership():
                log.info("handed leadership over before shutting down")
            await node.stop()
            if transport is not None:
                await transport.close()
            await streams.forwarder.close()
            state_kv.close()
            raft_kv.close()

    starlette = Starlette(
        routes=[
            Route("/healthz", healthz),
            Route("/openapi.yaml", openapi),
            Route(TRANSPORT_PATH, raft_messages, methods=["POST"]),
        ],
        lifespan=lifespan,
        exception_handlers={404: not_found, 405: method_not_allowed, 500: server_error},
    )
    streams = StreamRoutes(starlette)
    cors = CORSMiddleware(
        streams,
        allow_origins=["*"],
        allow_methods=["GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS"],
        allow_headers=["*"],
        expose_headers=EXPOSED_HEADERS,
        max_age=86400,
    )

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        # Only browser requests carry Origin; the rest skip the CORS wrapper's per-message work.
        if scope["type"] == "http" and any(name == b"origin" for name, _ in scope["headers"]):
            await cors(scope, receive, with_security_headers(send))
        else:
            await streams(scope, receive, send)

    return app
