"""The ASGI application: a node (app/service/build.py) behind its routes, and its lifespan."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path

from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from app.cluster.checkpoints import PATH as CHECKPOINT_PATH
from app.cluster.transport import PATH as TRANSPORT_PATH
from app.config import Settings
from app.console import routes as console_routes
from app.counters.counts import RequestCounters
from app.observability import probes
from app.observability.metrics import NodeCollector
from app.observability.requests import count_requests
from app.protocol.errors import error_reply
from app.protocol.http import send_reply, to_response
from app.routes import StreamRoutes
from app.routes import cluster as cluster_routes
from app.routes.cors import Cors
from app.routes.forward import Forwarder
from app.security.authenticator import Authenticator
from app.security.jwt_tokens import is_loopback
from app.service.build import Node, OpenKV, build_node, own_origins
from app.service.clock import wall_clock_ms
from app.serving.clients import ClientSlots

log = logging.getLogger("rill.server")

OPENAPI = Path(__file__).resolve().parent.parent / "openapi" / "rill.yaml"


def create_app(
    settings: Settings,
    open_kv: OpenKV | None = None,
    clients: ClientSlots | None = None,
    requests: RequestCounters | None = None,
) -> ASGIApp:
    """The app for one node: its stores open here, its Raft node and workers start with the lifespan.
    `open_kv` and `clients` are build_node's (a test's stores; the HTTP edge's per-address count);
    `requests`, the counts the edge adds what it refuses itself to."""
    auth = Authenticator(settings.auth, wall_clock_ms)
    if not auth.enabled and not is_loopback(settings.host):
        log.warning(
            "AUTH IS OFF on %s: anyone who can reach this address can create, change and delete every "
            'bucket and stream. Set auth = "on" with tokens (see README: Running it securely).',
            settings.host,
        )
    node = build_node(settings, open_kv, clients)
    forwarder = Forwarder(node.peer_tls)
    requests = requests if requests is not None else RequestCounters()
    metrics = CollectorRegistry(auto_describe=False)
    metrics.register(NodeCollector(node.engine, requests, node.tiering, node.backups))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await node.start()
        try:
            yield
        finally:
            await node.stop()
            await forwarder.close()
            node.stop_pools()  # last: the closes above may still use the pools

    fallback = Starlette(
        routes=_routes(),
        lifespan=lifespan,
        exception_handlers={404: _not_found, 405: _method_not_allowed, 500: _server_error},
    )
    # Starlette would answer /healthz/ with a redirect to an absolute URL built from the Host header.
    fallback.router.redirect_slashes = False
    state = fallback.state  # what the probes and the cluster routes read from request.app.state
    state.auth, state.peer_tls, state.forwarder, state.metrics = auth, node.peer_tls, forwarder, metrics
    state.engine, state.tiering, state.backups, state.transport = (
        node.engine,
        node.tiering,
        node.backups,
        node.transport,
    )
    state.verifier, state.checkpoints = node.verifier, node.checkpoints
    streams = Cors(StreamRoutes(node.engine, auth, forwarder, fallback), settings.cors_origins, own_origins(settings))
    return count_requests(_with_raft_messages(streams, node), requests)


def _routes() -> list[BaseRoute]:
    return [
        Route("/healthz", probes.healthz),
        Route("/readyz", probes.readyz),
        Route("/metrics", probes.metrics),
        Route("/_rill/cluster", probes.cluster),
        Route(probes.STATUS_PATH, probes.status),
        Route("/openapi.yaml", _openapi),
        Route(CHECKPOINT_PATH, cluster_routes.checkpoint_chunk, methods=["POST"]),
        Route("/_rill/members", cluster_routes.list_members, methods=["GET"]),
        Route("/_rill/members", cluster_routes.add_member, methods=["POST"]),
        Route("/_rill/members/{node_id}", cluster_routes.remove_member, methods=["DELETE"]),
        *console_routes(),
    ]


def _with_raft_messages(app: ASGIApp, node: Node) -> ASGIApp:
    """The peers' Raft messages, ahead of everything else: the hottest path of a cluster."""

    async def serve(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == TRANSPORT_PATH:
            if scope["method"] == "POST":
                await cluster_routes.raft_messages(node.engine, node.verifier, node.transport, scope, receive, send)
            elif scope["method"] == "GET":  # an Upgrade to a framed channel
                await cluster_routes.raft_channel(node.engine, node.transport, scope, receive, send)
            else:
                await send_reply(send, error_reply(405, "method_not_allowed", "POST or GET", {"allow": "POST, GET"}))
            return
        await app(scope, receive, send)

    return serve


async def _openapi(request: Request) -> Response:
    return FileResponse(OPENAPI, media_type="application/yaml")


def _error(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> Response:
    return to_response(error_reply(status, code, message, headers))


async def _not_found(request: Request, exc: Exception) -> Response:
    return _error(404, "not_found", "no such route")


async def _method_not_allowed(request: Request, exc: Exception) -> Response:
    return _error(405, "method_not_allowed", f"{request.method} is not allowed here", getattr(exc, "headers", None))


async def _server_error(request: Request, exc: Exception) -> Response:
    return _error(500, "internal_error", "internal server error")
