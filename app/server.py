"""The ASGI application: routes, middleware, and the node's lifecycle (stores, Raft, engine)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import ipaddress
import logging
import os
import signal
import socket
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from app.cluster import routes as cluster_routes
from app.cluster.checkpoints import PATH as CHECKPOINT_PATH
from app.cluster.checkpoints import Checkpoints
from app.cluster.driver import RaftNode
from app.cluster.http1 import client_context
from app.cluster.transport import PATH as TRANSPORT_PATH
from app.cluster.transport import Transport, Verifier
from app.config import Settings
from app.console import routes as console_routes
from app.node import Engine, Limits, Signals, wall_clock_ms
from app.observability import probes
from app.observability.counters import RequestCounters
from app.observability.metrics import NodeCollector
from app.observability.requests import count_requests
from app.protocol.errors import error_reply
from app.protocol.http import send_reply, to_response, with_security_headers
from app.raft import log_store
from app.raft.log_store import LogStore
from app.raft.messages import Membership
from app.routes import StreamRoutes
from app.runtime import blocking
from app.security.authenticator import Authenticator
from app.security.quotas import Quotas
from app.serving.clients import ClientSlots
from app.state_machine.machine import StateMachine
from app.state_machine.records import COLUMN_FAMILIES
from app.storage.disk import DiskGuard
from app.storage.kv import KV
from app.storage.rocks import RocksKV, reopen_need
from app.storage.state_store import StateStore
from app.subscriptions.delivery import Deliveries
from app.subscriptions.settings import WebhookSettings
from app.subscriptions.signing import WebhookSigner
from app.subscriptions.urls import parse_networks
from app.tiering.cache import SegmentCache
from app.tiering.store import FileStore, StoreOptions, open_store
from app.tiering.worker import TieringConfig, TieringWorker

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
    "Stream-Earliest-Offset",
    "Stream-Snapshot-Offset",
    "Stream-Snapshot-Digest",
    "Stream-Retention",
    "WWW-Authenticate",
]
# Request headers a cross-origin page may send. Any origin may read (public buckets, EventSource);
# only the origins in `cors_origins` may write or send a token.
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


async def openapi(request: Request) -> Response:
    return FileResponse(OPENAPI, media_type="application/yaml")


def _error(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> Response:
    return to_response(error_reply(status, code, message, headers))


async def not_found(request: Request, exc: Exception) -> Response:
    return _error(404, "not_found", "no such route")


async def method_not_allowed(request: Request, exc: Exception) -> Response:
    return _error(405, "method_not_allowed", f"{request.method} is not allowed here", getattr(exc, "headers", None))


async def server_error(request: Request, exc: Exception) -> Response:
    return _error(500, "internal_error", "internal server error")


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def base_url(settings: Settings) -> str:
    """What the URLs this node hands out start with (Location headers, a subscription's callback and
    JWKS URLs): `public_url`; else this node's URL in `peers` (the address the operator gave it, which
    the other nodes and 307 redirects use); else the address it listens on, a wildcard one (0.0.0.0,
    ::) standing for the machine's host name. Never a request's Host header, which the client chooses."""
    if settings.public_url:
        return settings.public_url.rstrip("/")
    own = settings.peers.get(settings.node_id)
    if own:
        return own.rstrip("/")
    host = settings.host
    if host in ("", "0.0.0.0", "::"):
        host = socket.gethostname()
    elif ":" in host:
        host = f"[{host}]"  # an IPv6 literal
    return f"{'https' if settings.tls_cert else 'http'}://{host}:{settings.port}"


def create_app(
    settings: Settings,
    open_kv: Callable[[Path, list[str]], KV] | None = None,
    clients: ClientSlots | None = None,
) -> ASGIApp:
    """`open_kv(path, column_families)` opens the Raft log's and the state machine's stores; RocksDB by default.
    `clients` is the HTTP edge's count of connections per address, from which the cluster's nodes are exempted."""

    auth = Authenticator(settings.auth, wall_clock_ms)
    # Peers and a forwarded write's leader at https:// URLs are verified against --tls-ca (default: system CAs).
    peer_tls = client_context(settings.tls_ca) if settings.tls_ca is not None else None
    if not auth.enabled and not _loopback(settings.host):
        log.warning(
            "AUTH IS OFF on %s: anyone who can reach this address can create, change and delete every "
            'bucket and stream. Set auth = "on" with tokens (see README: Running it securely).',
            settings.host,
        )

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        data_dir = Path(settings.data_dir)
        state_store = StateStore(data_dir, COLUMN_FAMILIES)
        disk = DiskGuard(
            data_dir,
            settings.disk_min_free_bytes,
            settings.disk_min_free_ratio,
            settings.disk_ballast_bytes,
            reserve=lambda: reopen_need(data_dir / "raft") + reopen_need(state_store.path),
        )
        disk.start()  # before the stores open: opening writes, and on a full disk the ballast makes room
        raft_kv = (open_kv or RocksKV)(data_dir / "raft", log_store.COLUMN_FAMILIES)
        signals = Signals()
        state_kv = state_store.open() if open_kv is None else open_kv(state_store.path, COLUMN_FAMILIES)
        machine = StateMachine(
            state_kv,
            on_change=signals.notify,
            tail_cache_bytes=settings.tail_cache_bytes,
            tail_stream_bytes=settings.tail_stream_bytes,
        )
        membership = machine.membership or Membership(settings.peers or {settings.node_id: ""})
        secret = settings.cluster_secret.encode()
        if settings.unsafe_test_fault:
            log.warning("UNSAFE TEST BUILD (%s): writes may be lost, reads stale", settings.unsafe_test_fault)
        clustered = bool(settings.peers) or len(membership.voters) + len(membership.learners) > 1
        members = {**membership.learners, **membership.voters}
        transport = Transport(settings.node_id, members, secret, peer_tls, settings.peer_routes) if clustered else None
        checkpoints = Checkpoints(state_store, machine, transport)
        node = RaftNode(
            settings.node_id,
            sorted(membership.voters),
            LogStore(raft_kv),
            machine,
            learners=sorted(membership.learners),
            send=transport.send if transport else None,
            checkpoints=checkpoints,
            tick_seconds=settings.raft_tick_seconds,
            compact_entries=settings.raft_compact_entries,
            compact_keep=settings.raft_compact_keep,
            unsafe_commit_alone=settings.unsafe_test_fault == "commit-alone",
        )
        checkpoints.node = node
        app.state.verifier = Verifier(secret, settings.node_id)
        app.state.transport = transport
        if transport is not None:
            transport.take_replies(app.state.verifier, node.receive)
        app.state.checkpoints = checkpoints
        limits = Limits(
            max_body_bytes=settings.max_body_bytes,
            read_chunk_bytes=settings.read_chunk_bytes,
            snapshot_max_bytes=settings.snapshot_max_bytes,
            bootstrap_max_bytes=settings.bootstrap_max_bytes,
            long_poll_seconds=settings.long_poll_timeout,
            sse_max_seconds=settings.sse_max_seconds,
            sse_ping_seconds=settings.sse_ping_seconds,
            sse_buffer_bytes=settings.sse_buffer_bytes,
            public_url=settings.public_url.rstrip("/") if settings.public_url else None,
            base_url=base_url(settings),
            body_budget_bytes=settings.body_budget_bytes,
        )
        store = open_store(
            settings.cold_store or str((data_dir / "cold").resolve()),
            StoreOptions(
                endpoint_url=settings.s3_endpoint_url, region=settings.s3_region, path_style=settings.s3_path_style
            ),
        )
        if clustered and isinstance(store, FileStore):
            log.warning("cold store %s is a local directory: every node must see the same one", store.url)
        engine = Engine(
            node,
            machine,
            signals,
            limits,
            settings.peers,
            settings.forward_writes,
            cold=SegmentCache(store, settings.cold_cache_bytes),
            hot_backlog_budget=settings.hot_backlog_budget,
            store=store,
            disk=disk,
            quotas=Quotas(machine, settings.bucket_quota, settings.bucket_quotas),
            peer_routes=settings.peer_routes,
            unsafe_skip_read_barrier=settings.unsafe_test_fault == "read-without-barrier",
        )
        app.state.engine = engine
        signer = WebhookSigner.from_secret(secret) if secret else WebhookSigner.from_file(data_dir / "webhook.key")
        engine.webhooks = WebhookSettings(signer, parse_networks(settings.webhook_allowed_networks))
        deliveries = Deliveries(engine)
        engine.delivery_status = deliveries.status
        streams.bind(engine)
        tiering = TieringWorker(
            engine,
            store,
            TieringConfig(
                segment_max_bytes=settings.segment_max_bytes,
                segment_max_age=settings.segment_max_age,
                local_disk_budget=settings.local_disk_budget,
                interval=settings.tiering_interval,
            ),
        )
        app.state.tiering = tiering
        registry = CollectorRegistry(auto_describe=False)
        registry.register(NodeCollector(engine, requests, tiering))
        app.state.metrics = registry

        def membership_changed(new: Membership) -> None:
            engine.set_membership(new)
            if transport is not None:
                transport.set_peers(engine.peers)
            if clients is not None:
                clients.peers_changed()

        node.on_membership = membership_changed
        node.on_failure = lambda: os.kill(os.getpid(), signal.SIGTERM)

        def others() -> list[str]:
            return [url for pid, url in engine.peers.items() if pid != settings.node_id]

        # The other nodes' Raft messages and forwarded writes must not meet the per-client connection limit.
        exempting = asyncio.create_task(clients.follow_peers(others)) if clients is not None else None
        await node.start()
        # Long-lived startup objects leave the collector's view, and young collections run less
        # often: request objects die by reference counting, and full passes cost p99 latency.
        gc.collect()
        gc.freeze()
        gc.set_threshold(20_000, 20, 100)
        sweeper = asyncio.create_task(engine.collect_expired_forever())
        tierer = asyncio.create_task(tiering.run_forever())
        deliverer = asyncio.create_task(deliveries.run_forever())
        blocking.start()
        try:
            yield
        finally:
            sweeper.cancel()
            tierer.cancel()
            deliverer.cancel()
            if exempting is not None:
                exempting.cancel()
            if transport is not None and await node.transfer_leadership():
                log.info("handed leadership over before shutting down")
            await node.stop()
            await checkpoints.close()
            if transport is not None:
                await transport.close()
            await streams.forwarder.close()
            machine.kv.close()
            raft_kv.close()
            blocking.shutdown()  # last: the closes above may still use the pools

    starlette = Starlette(
        routes=[
            Route("/healthz", probes.healthz),
            Route("/readyz", probes.readyz),
            Route("/metrics", probes.metrics),
            Route("/_rill/cluster", probes.cluster),
            Route(probes.STATUS_PATH, probes.status),
            Route("/openapi.yaml", openapi),
            Route(CHECKPOINT_PATH, cluster_routes.checkpoint_chunk, methods=["POST"]),
            Route("/_rill/members", cluster_routes.list_members, methods=["GET"]),
            Route("/_rill/members", cluster_routes.add_member, methods=["POST"]),
            Route("/_rill/members/{node_id}", cluster_routes.remove_member, methods=["DELETE"]),
            *console_routes(),
        ],
        lifespan=lifespan,
        exception_handlers={404: not_found, 405: method_not_allowed, 500: server_error},
    )
    # Starlette would answer /healthz/ with a redirect to an absolute URL built from the Host header.
    starlette.router.redirect_slashes = False
    starlette.state.auth = auth
    starlette.state.peer_tls = peer_tls
    requests = RequestCounters()
    streams = StreamRoutes(starlette, auth)
    streams.forwarder.tls = peer_tls
    starlette.state.forwarder = streams.forwarder
    # Listed origins (or `*` listed) get every method, a token and the protocol's headers; any other
    # origin only reads. Preflights for a write from elsewhere, and the writes' responses, are not
    # approved: no Access-Control-Allow-Origin.
    trusted = CORSMiddleware(
        streams,
        allow_origins=settings.cors_origins,
        allow_methods=["GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS"],
        allow_headers=READ_REQUEST_HEADERS + WRITE_REQUEST_HEADERS,
        expose_headers=EXPOSED_HEADERS,
        max_age=86400,
    )
    reads = CORSMiddleware(
        streams,
        allow_origins=["*"],
        allow_methods=_READ_METHODS,
        allow_headers=READ_REQUEST_HEADERS,
        expose_headers=EXPOSED_HEADERS,
        max_age=86400,
    )
    refused = CORSMiddleware(streams, allow_origins=(), allow_methods=_READ_METHODS, allow_headers=READ_REQUEST_HEADERS)

    def cors_for(scope: Scope, origin: str) -> CORSMiddleware:
        if trusted.is_allowed_origin(origin):
            return trusted
        method = scope["method"]
        if method == "OPTIONS":  # a preflight asks for the method it would send
            asked = (v for n, v in scope["headers"] if n == b"access-control-request-method")
            method = next(asked, b"OPTIONS").decode("latin-1")
        return reads if method in _READ_METHODS else refused

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == TRANSPORT_PATH:
            if scope["method"] == "POST":
                state = starlette.state
                await cluster_routes.raft_messages(state.engine, state.verifier, state.transport, scope, receive, send)
            else:
                await send_reply(send, error_reply(405, "method_not_allowed", "POST only", {"allow": "POST"}))
            return
        # Only browser requests carry Origin; the rest skip the CORS wrappers' per-message work.
        if scope["type"] == "http":
            for name, value in scope["headers"]:
                if name == b"origin":
                    await cors_for(scope, value.decode("latin-1"))(scope, receive, with_security_headers(send))
                    return
        await streams(scope, receive, send)

    return count_requests(app, requests)
