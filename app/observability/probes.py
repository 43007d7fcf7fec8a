"""Operators' routes: `/healthz` (alive, with details for an admin), `/readyz` (may take traffic),
`/metrics` (Prometheus), and `/_rill/cluster` (every member's view, for the console).

With auth on, the details, the metrics and the cluster view need a token with `admin:*`; the two
probes' plain answers need none, so a load balancer or an orchestrator can ask without one.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from prometheus_client import CollectorRegistry, generate_latest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from app.cluster.routes import check_admin
from app.domain.errors import ProtocolError
from app.node import Engine
from app.raft.ready import Role
from app.security.scopes import ANY_BUCKET, Action
from app.tiering.worker import TieringWorker

# The classic text format, which generate_latest writes and every Prometheus version reads.
TEXT_FORMAT = "text/plain; version=0.0.4; charset=utf-8"
PEER_TIMEOUT = 2.0  # seconds the cluster view waits for a member's /healthz


def details(engine: Engine, tiering: TieringWorker) -> dict[str, Any]:
    status = engine.node.status()
    return {
        "status": "ok",
        "node": status.id,
        "role": status.role.value,
        "term": status.term,
        "leader": status.leader or None,
        "commit": status.commit,
        "applied": status.applied,
        "last_index": status.last_index,
        "snapshot_index": status.checkpoint_index,  # the key is external: it keeps its old name
        "voters": list(status.voters),
        "learners": list(status.learners),
        "peers": {str(node_id): url for node_id, url in engine.peers.items()},
        "tiering": tiering.status(),
        "disk": engine.disk.status() if engine.disk is not None else None,
    }


async def healthz(request: Request) -> Response:
    """With auth on, only an admin token sees more than `{"status": "ok"}` (a probe needs no token)."""
    auth = request.app.state.auth
    if auth.enabled:
        try:
            principal = await auth.principal(request.headers)
        except ProtocolError:
            principal = None
        if principal is None or not principal.may(Action.ADMIN, ANY_BUCKET):
            return JSONResponse({"status": "ok"})
    return JSONResponse(details(request.app.state.engine, request.app.state.tiering))


def not_ready_because(engine: Engine) -> str | None:
    """Why this node should not take traffic now, or None: it must know a leader and have applied
    everything it knows committed (a node replaying its log, or cut off from the leader, is not ready)."""
    status = engine.node.status()
    if not status.leader:
        return "no leader is known"
    if status.applied < status.commit:
        return f"applying the log: {status.commit - status.applied} committed entries to go"
    return None


async def readyz(request: Request) -> Response:
    reason = not_ready_because(request.app.state.engine)
    if reason is None:
        return JSONResponse({"status": "ready"}, headers={"cache-control": "no-store"})
    return JSONResponse({"status": "not_ready", "reason": reason}, 503, {"cache-control": "no-store"})


async def metrics(request: Request) -> Response:
    if (refused := await check_admin(request, required=False)) is not None:
        return refused
    registry: CollectorRegistry = request.app.state.metrics
    return Response(generate_latest(registry), headers={"content-type": TEXT_FORMAT})


async def cluster(request: Request) -> Response:
    """Every member's /healthz view side by side, each with its lag behind the leader's commit."""
    if (refused := await check_admin(request, required=False)) is not None:
        return refused
    engine: Engine = request.app.state.engine
    here = details(engine, request.app.state.tiering)
    members = sorted((dict(engine.peers) or {engine.node.id: ""}).items())
    headers = {"authorization": request.headers["authorization"]} if "authorization" in request.headers else {}
    async with httpx.AsyncClient(timeout=PEER_TIMEOUT, verify=request.app.state.peer_tls or True) as client:
        views = await asyncio.gather(
            *(_peer(client, url, headers) if node != engine.node.id else _same(here) for node, url in members)
        )
    nodes = [_row(node, url, view) for (node, url), view in zip(members, views, strict=True)]
    commits = [n["commit"] for n in nodes if n.get("role") == Role.LEADER.value]
    for n in nodes:
        n["lag"] = max(0, commits[0] - n["applied"]) if commits and "applied" in n else None
    return JSONResponse({"nodes": nodes}, headers={"cache-control": "no-store"})


async def _same(view: dict[str, Any]) -> dict[str, Any] | None:
    return view


async def _peer(client: httpx.AsyncClient, url: str, headers: dict[str, str]) -> dict[str, Any] | None:
    try:
        answer = await client.get(url.rstrip("/") + "/healthz", headers=headers)
        body = answer.json()
    except (httpx.HTTPError, ValueError):
        return None
    return body if isinstance(body, dict) else None


def _row(node: int, url: str, view: dict[str, Any] | None) -> dict[str, Any]:
    row: dict[str, Any] = {"id": node, "url": url or None, "reachable": view is not None}
    for key in ("role", "term", "leader", "commit", "applied", "last_index"):
        if view is not None and key in view:
            row[key] = view[key]
    return row
