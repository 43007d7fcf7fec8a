"""Routes between nodes and for operators: Raft messages, snapshot chunks, and membership.

Raft traffic and snapshot chunks must carry a signature made with the cluster secret
(app/cluster/transport.py), so a client cannot speak Raft to a node. The signature header is
checked before any of the body is read, and the body is read only up to a cap, so an unsigned or
oversized request costs the node no memory. Membership changes need a token with `admin:*`,
whatever the auth mode (never the cluster secret); listing the members needs one when auth is on.
A change sent to a follower is redirected to the leader.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator, Mapping

import msgspec
from pydantic import BaseModel, Field, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

from app.cluster import channel
from app.cluster.checkpoints import decode_chunk
from app.cluster.driver import RaftNode
from app.cluster.driver_errors import MembershipBusy, MembershipRefused, NotLeader, ProposalDropped
from app.cluster.transport import AUTH_HEADER, REPLIES_HEADER, Signature, Transport, Verifier, message_cap
from app.cluster.transport import decode as decode_messages
from app.domain.errors import ProtocolError
from app.protocol.errors import error_reply, render_error
from app.protocol.http import Call, Reply, send_reply, to_response
from app.protocol.leader import leader_redirect
from app.raft.messages import MAX_NODE_ID, Membership, parse_node_id
from app.security.policy import require_admin
from app.service.engine import Engine
from app.service.limits import Limits
from app.serving.cycle import SWITCHED, TAKE_OVER

CATCH_UP_SECONDS = 120.0  # how long an added learner may take to catch up before promotion


class NewMember(BaseModel):
    id: int = Field(ge=1, le=MAX_NODE_ID)
    url: str = Field(pattern=r"^https?://[^/?#\s]+/?$", description="the node's advertised base URL")


def _error(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> Response:
    return to_response(error_reply(status, code, message, headers))


def _closing(exc: ProtocolError) -> ProtocolError:
    """A refusal sent before the body was read whole: the connection closes rather than drain it."""
    return ProtocolError(exc.status, exc.code, exc.message, {**exc.headers, "connection": "close"})


def _refused(exc: ProtocolError) -> Response:
    return to_response(render_error(_closing(exc)))


def _body_cap(limits: Limits) -> int:
    return message_cap(max(limits.max_body_bytes, limits.snapshot_max_bytes))


async def _signed(
    verifier: Verifier, cap: int, headers: Mapping[str, str], path: str, chunks: AsyncIterator[bytes]
) -> tuple[Signature, bytes]:
    """The request's signature and body: the header first, then the body up to the cap, then its digest."""
    sig = verifier.check(headers.get(AUTH_HEADER), path)
    declared = headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > cap):
        raise ProtocolError(413, "payload_too_large", f"internal messages are at most {cap} bytes")
    body = bytearray()
    hasher = hashlib.sha256()
    async for chunk in chunks:
        if len(body) + len(chunk) > cap:
            raise ProtocolError(413, "payload_too_large", f"internal messages are at most {cap} bytes")
        body += chunk
        hasher.update(chunk)
    if not verifier.body_matches(sig, hasher.hexdigest()):
        raise ProtocolError(403, "forbidden", "the body is not the one that was signed")
    return sig, bytes(body)


async def _signed_body(request: Request) -> tuple[Signature, bytes]:
    return await _signed(
        request.app.state.verifier,
        _body_cap(request.app.state.engine.limits),
        request.headers,
        request.scope["path"],
        request.stream(),
    )


async def _chunks(receive: Receive) -> AsyncIterator[bytes]:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ProtocolError(400, "client_disconnected", "the client went away mid-request")
        yield message.get("body", b"")
        if not message.get("more_body", False):
            return


async def raft_messages(
    engine: Engine, verifier: Verifier, transport: Transport | None, scope: Scope, receive: Receive, send: Send
) -> None:
    """POST of a batch of Raft messages. Served ahead of the router: a cluster sends one per batch of
    appends, and the router's machinery would cost more than the messages. The response carries
    this node's replies when the sender asks for them (see app/cluster/transport.py)."""
    call = Call.from_scope(scope, receive)
    try:
        sig, body = await _signed(verifier, _body_cap(engine.limits), call.headers, call.path, _chunks(receive))
    except ProtocolError as exc:
        await send_reply(send, render_error(_closing(exc)))
        return
    try:
        messages = decode_messages(body)
    except msgspec.DecodeError:
        await send_reply(send, error_reply(400, "bad_request", "undecodable Raft messages"))
        return
    node = engine.node
    if any(msg.src != sig.src or msg.dst != node.id for msg in messages):
        await send_reply(
            send, error_reply(400, "bad_request", "a message's sender or recipient is not the signature's")
        )
        return
    for msg in messages:
        node.receive(msg)
    if transport is not None and call.headers.get(REPLIES_HEADER) == "1":
        replies = await transport.replies_for(sig.src, messages)
        if replies:
            body, signature = transport.signed_reply(sig.src, replies)
            await send_reply(send, Reply(200, {"content-type": "application/msgpack", AUTH_HEADER: signature}, body))
            return
    await send_reply(send, Reply(204))


async def raft_channel(engine: Engine, transport: Transport | None, scope: Scope, receive: Receive, send: Send) -> None:
    """GET with `Upgrade: rill-raft-1`: a peer opens its framed channel (app/cluster/peer_channel.py).
    A node that takes none answers 404, and the peer sends by HTTP POST instead."""
    call = Call.from_scope(scope, receive)
    take_over = scope.get("extensions", {}).get(TAKE_OVER)
    hello = channel.parse_hello(call.headers.get(channel.HEADER))
    node = engine.node
    accepted = None
    if transport is not None and take_over is not None and hello is not None and _asks_for_channel(call.headers):
        client = scope.get("client") or ("", 0)
        accepted = transport.accept_channel(hello, node.receive_all, _body_cap(engine.limits), client[0])
    if accepted is None:
        await send_reply(send, error_reply(404, "no_channel", "this node takes no Raft channel from you"))
        return
    head, inbound = accepted
    try:
        take_over(head, inbound)
    except ConnectionError:
        inbound.close()
        return
    except BaseException:
        inbound.close()  # else it would hold a place among the unproven channels for good
        raise
    scope[SWITCHED] = True


def _asks_for_channel(headers: Mapping[str, str]) -> bool:
    """An Upgrade to the channel's protocol, and no body: the bytes after its head are the channel's."""
    upgrade = headers.get("upgrade", "").strip().lower() == channel.PROTOCOL
    connection = "upgrade" in (t.strip().lower() for t in headers.get("connection", "").split(","))
    bodiless = "transfer-encoding" not in headers and headers.get("content-length", "0").strip() == "0"
    return upgrade and connection and bodiless


async def checkpoint_chunk(request: Request) -> Response:
    try:
        sig, body = await _signed_body(request)
    except ProtocolError as exc:
        return _refused(exc)
    try:
        chunk = decode_chunk(body)
    except msgspec.DecodeError:
        return _error(400, "bad_request", "undecodable checkpoint chunk")
    if chunk.src != sig.src or chunk.dst != request.app.state.engine.node.id:
        return _error(400, "bad_request", "the chunk's sender or recipient is not the signature's")
    if await request.app.state.checkpoints.receive(request.app.state.engine.node, chunk):
        return Response(status_code=204)
    return _error(409, "snapshot_refused", "this transfer is stale or out of order")


async def check_admin(request: Request, required: bool = True) -> Response | None:
    """None if the request may go on; else the 401 or 403. Membership needs admin:* whatever the mode."""
    auth = request.app.state.auth
    if not required and not auth.enabled:
        return None
    try:
        require_admin(await auth.principal(request.headers))
    except ProtocolError as exc:
        return to_response(render_error(exc))
    return None


def _describe(engine: Engine) -> dict[str, object]:
    membership = engine.membership()
    node = engine.node
    status = node.status()
    return {
        "leader": status.leader or None,
        "voters": {str(k): v for k, v in sorted(membership.voters.items())},
        "learners": {str(k): v for k, v in sorted(membership.learners.items())},
        "match": {str(k): v for k, v in sorted(status.match.items())} if node.is_leader else None,
        "commit": status.commit,
    }


async def list_members(request: Request) -> Response:
    return await check_admin(request, required=False) or JSONResponse(_describe(request.app.state.engine))


async def _not_leader(request: Request, body: bytes = b"") -> Response:
    """On a follower: the leader's answer when followers forward writes, else a 307 to the leader.
    Forwarding lets a client that reaches only one node (compose's published ports) change membership."""
    engine: Engine = request.app.state.engine
    leader = engine.leader_url()
    if leader is None or not engine.forward_writes:
        return to_response(leader_redirect(leader, request.scope))
    call = Call.from_scope(request.scope, request.receive)
    forwarder = request.app.state.forwarder
    reply = await forwarder.forward(
        call, engine.leader_route() or leader, len(body), body=body, timeout=CATCH_UP_SECONDS + 30
    )
    return to_response(reply)


async def _change(node: RaftNode, new: Membership) -> Response | None:
    try:
        await node.change_membership(new)
    except MembershipBusy as exc:
        return _error(503, "retry", f"{exc}; retry the request", {"retry-after": "1"})
    except MembershipRefused as exc:
        return _error(409, "membership_conflict", str(exc))
    except (NotLeader, ProposalDropped):
        return _error(503, "retry", "leadership changed; retry the request", {"retry-after": "1"})
    return None


async def add_member(request: Request) -> Response:
    """Adds a node as a learner, waits for it to catch up, then makes it a voter."""
    if (refused := await check_admin(request)) is not None:
        return refused
    try:
        member = NewMember.model_validate_json(await request.body())
    except ValidationError:
        return _error(400, "bad_request", 'the body must be {"id": <node id>, "url": "http://host:port"}')
    engine: Engine = request.app.state.engine
    node = engine.node
    if not node.is_leader:
        return await _not_leader(request, await request.body())
    current = engine.membership()
    known = {**current.voters, **current.learners}
    if member.id in known and known[member.id] != member.url.rstrip("/"):
        return _error(409, "member_exists", f"node {member.id} is a member with another URL: {known[member.id]}")
    url = member.url.rstrip("/")
    if member.id not in known:
        failed = await _change(node, Membership(current.voters, {**current.learners, member.id: url}))
        if failed is not None:
            return failed
    if member.id not in engine.membership().voters:
        if not await _caught_up(node, member.id):
            return _error(
                503,
                "catching_up",
                f"node {member.id} is a learner still catching up; repeat the request to promote it",
                {"retry-after": "5"},
            )
        current = engine.membership()
        learners = {k: v for k, v in current.learners.items() if k != member.id}
        failed = await _change(node, Membership({**current.voters, member.id: url}, learners))
        if failed is not None:
            return failed
    return JSONResponse(_describe(engine))


async def _caught_up(node: RaftNode, peer: int) -> bool:
    """Waits until the learner holds everything that was committed when the wait began."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + CATCH_UP_SECONDS
    target = node.status().commit
    while loop.time() < deadline and node.is_leader:
        if node.status().match.get(peer, 0) >= target:
            return True
        await asyncio.sleep(0.05)
    return False


async def remove_member(request: Request) -> Response:
    if (refused := await check_admin(request)) is not None:
        return refused
    peer = parse_node_id(request.path_params["node_id"])
    if peer is None:
        return _error(400, "bad_request", f"the node id must be an integer from 1 to {MAX_NODE_ID}")
    engine: Engine = request.app.state.engine
    node = engine.node
    if not node.is_leader:
        return await _not_leader(request)
    current = engine.membership()
    if peer not in current.voters and peer not in current.learners:
        return _error(404, "member_not_found", f"node {peer} is not a member")
    if peer in current.voters and not set(current.voters) - {peer}:
        return _error(409, "membership_conflict", f"node {peer} is the only voter: the cluster would have none")
    if peer == node.id:
        # A leader leaving hands over first; the client repeats the request on the new leader.
        if not await node.transfer_leadership():
            return _error(503, "retry", "could not hand leadership over yet; retry", {"retry-after": "1"})
        return await _not_leader(request)
    voters = {k: v for k, v in current.voters.items() if k != peer}
    learners = {k: v for k, v in current.learners.items() if k != peer}
    failed = await _change(node, Membership(voters, learners))
    return failed or JSONResponse(_describe(engine))
