"""The protocol's subscriptions under a root: `{root}/__ds/subscriptions/{id}` (PUT, GET, DELETE),
its `streams`, the pull-wake `claim`, `ack` and `release`, the webhook `callback`, and
`{root}/__ds/jwks.json` with the key webhook deliveries are signed with.

A lease's bearer token (from a claim, or a webhook's `callback_token`) authorizes its ack, release
and callback; only its SHA-256 is replicated (see app/subscriptions/leases.py).

Nothing is proposed for a request that will be refused or that changes nothing: the leader checks
it against the applied state with the state machine's own rules first. Errors of these routes
carry the protocol's upper-case codes (`FENCED`, `ALREADY_CLAIMED`, ...); those of the shared edge
(authentication, access, a missing bucket or stream, busy) keep Rill's lower-case ones.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any, Literal
from urllib.parse import unquote

import msgspec
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.types import Send

from app.domain.errors import ProtocolError, bad_request
from app.domain.offsets import format_offset, parse_position
from app.protocol.bodies import read_body
from app.protocol.errors import answer, error_reply
from app.protocol.http import Call, Reply, absolute_url
from app.protocol.responses import NO_STORE, raise_for, refuse_early
from app.protocol.target import NAMESPACE, ControlTarget, validate_stream_id
from app.runtime import blocking
from app.security.authenticator import unauthorized
from app.service.engine import Engine
from app.state_machine import records as r
from app.state_machine import subscriptions as rules
from app.state_machine.commands import Ack, Claim, Code, DeleteSubscription, LinkStreams, Outcome, PutSubscription
from app.state_machine.glob import PatternRejected, validate_pattern
from app.subscriptions.leases import acked_offset, token_digest
from app.subscriptions.signing import JWKS_MEDIA_TYPE
from app.subscriptions.urls import WebhookUrlRejected, check_webhook_url

MAX_BODY = 64 * 1024
_json = msgspec.json.Encoder()
_JSON = {"content-type": "application/json", "cache-control": NO_STORE}
ALLOWED = {
    "jwks": ("GET", "HEAD"),
    "list": ("GET", "HEAD"),
    "subscription": ("GET", "HEAD", "PUT", "DELETE"),
    "streams": ("POST",),
    "stream": ("DELETE",),
    "claim": ("POST",),
    "ack": ("POST",),
    "release": ("POST",),
    "callback": ("POST",),
}
LEASE_AUTHORIZED = ("ack", "release", "callback")  # the lease's own token, not a user's


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class WebhookSpec(_Body):
    url: str = Field(max_length=2048)


class SubscriptionBody(_Body):
    type: Literal["webhook", "pull-wake"]
    pattern: str | None = None  # validate_pattern judges it (INVALID_PATTERN), empty and too long included
    streams: list[str] = Field(default_factory=list, max_length=1000)
    webhook: WebhookSpec | None = None
    wake_stream: str | None = Field(None, min_length=1, max_length=1024)
    lease_ttl_ms: int = Field(30_000, ge=1_000, le=600_000)
    description: str | None = Field(None, max_length=1024)


class StreamsBody(_Body):
    streams: list[str] = Field(min_length=1, max_length=1000)


class ClaimBody(_Body):
    worker: str = Field(min_length=1, max_length=256)


class AckItem(_Body):
    stream: str = Field(min_length=1, max_length=1024)
    offset: str


class AckBody(_Body):
    wake_id: str = Field(max_length=128)
    generation: int = Field(ge=0)
    acks: list[AckItem] = Field(default_factory=list, max_length=10_000)
    done: bool = False


async def serve_control(engine: Engine, call: Call, target: ControlTarget, send: Send) -> None:
    await answer(call, send, _dispatch(engine, call, target))


async def _dispatch(engine: Engine, call: Call, t: ControlTarget) -> Reply:
    allowed = ALLOWED[t.kind]
    if call.method == "OPTIONS":
        return Reply(204, {"allow": ", ".join((*allowed, "OPTIONS"))})
    if call.method not in allowed:
        return error_reply(
            405, "method_not_allowed", f"{call.method} is not allowed here", {"allow": ", ".join(allowed)}
        )
    if engine.webhooks is None:
        return error_reply(404, "not_found", "subscriptions are not served by this node")
    if t.kind == "jwks":
        body = _json.encode(engine.webhooks.signer.jwks())
        return Reply(200, {"content-type": JWKS_MEDIA_TYPE, "cache-control": "public, max-age=300"}, body)
    if t.kind == "list":
        return await _consumer_groups(engine, t)
    assert t.sub_id is not None
    if t.kind == "subscription":
        if call.method == "PUT":
            return await _put(engine, call, t)
        if call.method == "DELETE":
            await _refuse_early(engine, lambda: None if _find(engine, t) else rules.missing())
            _raise(await engine.submit(DeleteSubscription(t.bucket, t.root, t.sub_id)))
            return Reply(204)
        await engine.read_barrier()
        return _view_reply(engine, call, t, _found(engine, t), 200)
    if t.kind in ("streams", "stream"):
        if t.kind == "streams":
            add, remove = _parse(StreamsBody, await read_body(call, MAX_BODY)).streams, []
            for path in add:
                validate_stream_id(path)
        else:
            assert t.arg is not None
            add, remove = [], [t.arg]
        link = LinkStreams(t.bucket, t.root, t.sub_id, add, remove)
        await _refuse_early(engine, lambda: rules.link_refusal(engine.table, link))
        if not rules.link_changes(engine.table, link):
            await engine.read_barrier()  # a new leader may not have applied all it committed yet
            if not rules.link_changes(engine.table, link):
                return Reply(204)  # nothing to change: no log entry
        _raise(await engine.submit(link))
        return Reply(204)
    if t.kind == "claim":
        return await _claim(engine, call, t)
    return await _ack(engine, call, t)


async def _refuse_early(engine: Engine, refusal: Callable[[], Outcome | None]) -> None:
    await refuse_early(engine, refusal, _raise)


def _find(engine: Engine, t: ControlTarget) -> r.Subscription | None:
    assert t.sub_id is not None
    return rules.find(engine.table, t.bucket, t.root, t.sub_id)


def _parse(model: type[Any], raw: bytes) -> Any:
    try:
        return model.model_validate_json(raw or b"{}")
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in exc.errors())
        raise bad_request(f"invalid body: {problems}", "INVALID_BODY") from None


_SUBSCRIPTION_ERRORS = {
    Code.SUBSCRIPTION_NOT_FOUND: (404, "SUBSCRIPTION_NOT_FOUND"),
    Code.FENCED: (409, "FENCED"),
    Code.CONFIG_MISMATCH: (409, "SUBSCRIPTION_EXISTS"),
    Code.INVALID_PATTERN: (400, "INVALID_PATTERN"),
    Code.WAKE_STREAM_NOT_FOUND: (400, "WAKE_STREAM_NOT_FOUND"),
    Code.WAKE_STREAM_COVERED: (400, "WAKE_STREAM_COVERED"),
    Code.TOO_MANY_LINKS: (400, "TOO_MANY_STREAMS"),
    Code.TOO_MANY_SUBSCRIPTIONS: (400, "TOO_MANY_SUBSCRIPTIONS"),
    Code.NOT_FOUND: (400, "STREAM_NOT_LINKED"),  # an ack for a stream that is not the subscription's
    Code.BEYOND_TAIL: (400, "OFFSET_BEYOND_TAIL"),
    Code.NOT_BOUNDARY: (400, "OFFSET_NOT_BOUNDARY"),
}


def _raise(outcome: Outcome) -> None:
    known = _SUBSCRIPTION_ERRORS.get(outcome.code)
    if known is not None:
        raise ProtocolError(known[0], known[1], outcome.message)
    raise_for(outcome)


def _found(engine: Engine, t: ControlTarget) -> r.Subscription:
    assert t.sub_id is not None
    sub = rules.find(engine.table, t.bucket, t.root, t.sub_id)
    if sub is None:
        raise ProtocolError(404, "SUBSCRIPTION_NOT_FOUND", "no such subscription")
    return sub


async def _put(engine: Engine, call: Call, t: ControlTarget) -> Reply:
    assert t.sub_id is not None and engine.webhooks is not None
    body = _parse(SubscriptionBody, await read_body(call, MAX_BODY))
    for path in body.streams:
        validate_stream_id(path)
    if body.pattern is None and not body.streams:
        raise bad_request("a subscription needs a pattern or streams", "INVALID_BODY")
    if body.pattern is not None:
        try:
            validate_pattern(body.pattern)
        except PatternRejected as exc:
            raise ProtocolError(400, "INVALID_PATTERN", str(exc)) from None
    url = None
    if body.type == "webhook":
        if body.webhook is None:
            raise bad_request("a webhook subscription needs webhook.url", "INVALID_BODY")
        url = body.webhook.url
    elif body.wake_stream is None:
        raise bad_request("a pull-wake subscription needs wake_stream", "INVALID_BODY")
    else:
        validate_stream_id(body.wake_stream)
    command = PutSubscription(
        t.bucket, t.root, t.sub_id, body.type, body.pattern, body.streams, url,
        body.wake_stream if body.type == "pull-wake" else None, body.lease_ttl_ms, body.description,
        root_url(call, engine),
    )  # fmt: skip
    await engine.read_barrier()
    table = engine.table
    outcome = rules.existing_put(table, command) or rules.put_refusal(table, command)
    if outcome is None:
        if url is not None:
            try:
                await blocking.run("webhook_dns", check_webhook_url, url, engine.webhooks.allowed)
            except WebhookUrlRejected as exc:
                raise ProtocolError(400, "WEBHOOK_URL_REJECTED", str(exc)) from None
        outcome = await engine.submit(command)
    _raise(outcome)
    assert outcome.subscription is not None
    return _view_reply(engine, call, t, outcome.subscription, 201 if outcome.code is Code.CREATED else 200)


def root_url(call: Call, engine: Engine) -> str:
    """The root's absolute URL (stored for callback URLs): never under a host the configuration does not name."""
    url = absolute_url(call, engine)
    segments = url.split("/")  # scheme, "", host, then the path as the client sent it (percent-encoded)
    for at in range(3, len(segments)):
        if unquote(segments[at]) == NAMESPACE:  # the route matched the first one, decoded (%5F_ds too)
            return "/".join(segments[:at])
    raise bad_request("a subscription route names one: __ds/subscriptions/{id}", "invalid_subscription_id")


def streams_view(engine: Engine, sub: r.Subscription) -> list[dict[str, Any]]:
    table = engine.table
    out = []
    for path, kind in sorted(rules.linked(table, sub).items()):
        sid = table.names.get((sub.bucket, rules.stream_name(sub, path)))
        acked = sub.acked.get(path, -1)
        item: dict[str, Any] = {"path": path, "link_type": kind, "acked_offset": acked_offset(acked)}
        if sid is not None:
            tail = table.streams[sid].tail
            item["tail_offset"] = format_offset(tail)
            item["has_pending"] = tail > max(acked, 0)
        out.append(item)
    return out


def _view_reply(engine: Engine, call: Call, t: ControlTarget, sub: r.Subscription, status: int) -> Reply:
    assert engine.webhooks is not None
    view: dict[str, Any] = {
        "id": sub.id, "type": sub.type, "pattern": sub.pattern, "streams": streams_view(engine, sub),
        "lease_ttl_ms": sub.lease_ttl_ms, "description": sub.description, "generation": sub.generation,
        "holder": sub.holder,
    }  # fmt: skip
    if sub.webhook_url is not None:
        signer = engine.webhooks.signer
        jwks_url = f"{root_url(call, engine)}/__ds/jwks.json"
        view["webhook"] = {
            "url": sub.webhook_url,
            "signing": {"alg": "ed25519", "kid": signer.kid, "jwks_url": jwks_url},
        }
    if sub.wake_stream is not None:
        view["wake_stream"] = sub.wake_stream
    trouble = engine.delivery_status(r.subscription_key(sub.bucket, sub.root, sub.id))
    if trouble is not None:
        view["delivery"] = trouble  # known to the leader only
    return Reply(status, _JSON, _json.encode(view))


async def _consumer_groups(engine: Engine, t: ControlTarget) -> Reply:
    """`{stream}/__ds/subscriptions`: every subscription the stream belongs to, with its lag."""
    meta = await engine.find_latest(t.bucket, t.root)
    table = engine.table
    groups = []
    for key in sorted(table.coverage.covering(meta)):
        raw = table.get(r.SUBSCRIPTIONS, key)
        if not raw:
            continue
        sub = r.decode_subscription(raw)
        path = t.root[len(sub.root) + 1 :] if sub.root else t.root
        lag_bytes, lag_messages = rules.lag(table, sub, path)
        groups.append(
            {
                "id": sub.id, "root": sub.root, "type": sub.type, "path": path,
                "acked_offset": acked_offset(sub.acked.get(path, -1)), "tail_offset": format_offset(meta.tail),
                "lag_bytes": lag_bytes, "lag_messages": lag_messages,
                "holder": sub.holder, "generation": sub.generation,
            }
        )  # fmt: skip
    return Reply(200, _JSON, _json.encode({"stream": t.root, "subscriptions": groups}))


async def _claim(engine: Engine, call: Call, t: ControlTarget) -> Reply:
    assert t.sub_id is not None and engine.webhooks is not None
    body = _parse(ClaimBody, await read_body(call, MAX_BODY))
    token = engine.webhooks.leases.issue(t.bucket, t.root, t.sub_id)
    claim = Claim(t.bucket, t.root, t.sub_id, body.worker, "w_" + secrets.token_hex(8), token_digest(token))
    outcome = rules.claim_refusal(engine.table, claim, engine.now_ms())
    if outcome is not None:  # confirmed after a read barrier (a new leader may lag what it committed)
        await engine.read_barrier()
        outcome = rules.claim_refusal(engine.table, claim, engine.now_ms())
    if outcome is None:
        outcome = await engine.submit(claim)
    if outcome.code is Code.ALREADY_CLAIMED and outcome.subscription is not None:
        error = {"code": "ALREADY_CLAIMED", "message": outcome.message, "current_holder": outcome.subscription.holder}
        return Reply(409, _JSON, _json.encode({"error": error}))
    _raise(outcome)
    sub = outcome.subscription
    assert sub is not None
    claimed = {
        "subscription_id": sub.id, "wake_id": sub.wake_id, "generation": sub.generation, "token": token,
        "lease_expires_at": sub.lease_until, "streams": streams_view(engine, sub),
    }  # fmt: skip
    return Reply(200, _JSON, _json.encode(claimed))


async def _ack(engine: Engine, call: Call, t: ControlTarget) -> Reply:
    """ack, release and callback: a made-up token is refused before anything else, alike whether the
    subscription exists or not; a stale one is fenced; only an ack that changes something is proposed."""
    assert t.sub_id is not None and engine.webhooks is not None
    scheme, _, token = call.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token:
        raise unauthorized("this needs the lease's token as a bearer token")
    if not engine.webhooks.leases.genuine(token.strip(), t.bucket, t.root, t.sub_id):
        raise unauthorized("the token is not a lease of this subscription", "invalid_token")
    body = _parse(AckBody, await read_body(call, MAX_BODY))
    acks = []
    for item in body.acks:
        acks.append((item.stream, parse_position(item.offset)))
    done = body.done or t.kind == "release"
    command = Ack(t.bucket, t.root, t.sub_id, body.wake_id, body.generation, token_digest(token.strip()), acks, done)
    table = engine.table
    await _refuse_early(
        engine,
        lambda: (
            rules.ack_refusal(engine.table, command, engine.now_ms())
            or rules.ack_boundary_refusal(engine.table, command)
        ),
    )
    if rules.ack_changes(table, command, engine.now_ms()):
        outcome = await engine.submit(command)
        _raise(outcome)
        sub = outcome.subscription
    else:
        sub = _find(engine, t)
    if t.kind == "release":
        return Reply(204)
    next_wake = sub is not None and bool(rules.pending(engine.table, sub))
    return Reply(200, _JSON, _json.encode({"ok": True, "next_wake": next_wake}))
