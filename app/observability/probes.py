"""Operators' routes: `/healthz` (alive, with details for an admin), `/readyz` (may take traffic),
`/metrics` (Prometheus), and `/_rill/cluster` (every member's view, for the console), which asks
the other members' `/_rill/status` over the signed cluster channel.

With auth on, the details, the metrics and the cluster view need a token with `admin:*`; the two
probes' plain answers need none, so a load balancer or an orchestrator can ask without one.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
from prometheus_client import CollectorRegistry, generate_latest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from app.cluster.transport import AUTH_HEADER, sign
from app.domain.errors import ProtocolError
from app.protocol.errors import render_error
from app.protocol.http import to_response
from app.raft.ready import Role
from app.routes.cluster import check_admin
from app.security.scopes import ANY_BUCKET, Action
from app.service.engine import Engine
from app.tiering.backups import StateBackups
from app.tiering.worker import TieringWorker

# The classic text format, which generate_latest writes and every Prometheus version reads.
TEXT_FORMAT = "text/plain; version=0.0.4; charset=utf-8"
PEER_TIMEOUT = 2.0  # seconds the cluster view waits for a member's details, in all
STATUS_PATH = "/_rill/status"
READY_SLACK = 2.0  # seconds since the node last had applied all it knew committed


def details(engine: Engine, tiering: TieringWorker, backups: StateBackups) -> dict[str, Any]:
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
        "recovery_point": backups.status(engine.now_ms(), tiering.oldest_unsealed),
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
    return JSONResponse(details(request.app.state.engine, request.app.state.tiering, request.app.state.backups))


def not_ready_because(engine: Engine) -> str | None:
    """Why this node should not take traffic now, or None: it must hear from a leader and have applied
    everything it knows committed (a node replaying its log, or cut off from the leader, is not ready).
    A busy follower is a sync behind the commit most of the time: having caught up within the last
    READY_SLACK seconds counts, so readiness does not flap under load."""
    node = engine.node
    status = node.status()
    if not status.leader:
        return "no leader is known"
    if not node.hears_from_leader():
        return "no word from the leader within an election timeout"
    behind = status.commit - status.applied
    if behind > 0 and time.monotonic() - node.caught_up_at > READY_SLACK:
        return f"applying the log: {behind} committed entries to go"
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


async def status(request: Request) -> Response:
    """This node's details for another member, asked over the signed cluster channel (no user token
    travels between nodes): the request must carry a signature made with the cluster secret."""
    try:
        request.app.state.verifier.check(request.headers.get(AUTH_HEADER), STATUS_PATH)
    except ProtocolError as exc:
        return to_response(render_error(exc))
    return JSONResponse(details(request.app.state.engine, request.app.state.tiering, request.app.state.backups))


async def cluster(request: Request) -> Response:
    """Every member's details side by side, each with its lag behind the leader's commit."""
    if (refused := await check_admin(request, required=False)) is not None:
        return refused
    engine: Engine = request.app.state.engine
    me = engine.node.id
    members = sorted((dict(engine.peers) or {me: ""}).items())
    secret: bytes = request.app.state.verifier.secret
    async with httpx.AsyncClient(timeout=PEER_TIMEOUT, verify=request.app.state.peer_tls or True) as client:
        views = await asyncio.gather(
            *(_peer(client, url, sign(secret, me, node, STATUS_PATH, b"")) for node, url in members if node != me)
        )
    others = iter(views)
    here = details(engine, request.app.state.tiering, request.app.state.backups)
    nodes = [_row(node, url, here if node == me else next(others)) for node, url in members]
    leaders = [n for n in nodes if n.get("role") == Role.LEADER.value and "commit" in n]
    commit = max(leaders, key=lambda n: n.get("term", 0))["commit"] if leaders else None
    for n in nodes:
        n["lag"] = max(0, commit - n["applied"]) if commit is not None and "applied" in n else None
    return JSONResponse({"nodes": nodes}, headers={"cache-control": "no-store"})


async def _peer(client: httpx.AsyncClient, url: str, signature: str) -> dict[str, Any] | None:
    """A member's details, or None if it does not answer well within PEER_TIMEOUT in all."""
    try:
        async with asyncio.timeout(PEER_TIMEOUT):
            answer = await client.get(url.rstrip("/") + STATUS_PATH, headers={AUTH_HEADER: signature})
            body = answer.json() if answer.status_code == 200 else None
    except Exception:  # unreachable, slow, a bad URL or a bad answer: the member shows as unreachable
        return None
    return body if isinstance(body, dict) else None


def _row(node: int, url: str, view: dict[str, Any] | None) -> dict[str, Any]:
    row: dict[str, Any] = {"id": node, "url": url or None, "reachable": view is not None}
    for key in ("term", "leader", "commit", "applied", "last_index"):
        value = view.get(key) if view is not None else None
        if isinstance(value, int) and not isinstance(value, bool):
            row[key] = value
    if view is not None and isinstance(view.get("role"), str):
        row["role"] = view["role"]
    return row
