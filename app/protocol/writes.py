"""Create, append (and close), delete: parse once, submit through Raft, render the outcome."""

from __future__ import annotations

from app.domain.errors import bad_request, missing_bucket
from app.domain.media import DEFAULT_CONTENT_TYPE, JSON, media_type
from app.domain.offsets import parse_position
from app.protocol.attrs import parse_attrs
from app.protocol.bodies import Body, json_record, read_buffer
from app.protocol.headers import (
    parse_expires_at,
    parse_flag,
    parse_producer,
    parse_stream_seq,
    parse_sub_offset,
    parse_ttl,
)
from app.protocol.http import Call, Reply, absolute_url
from app.protocol.responses import confirmed, raise_for, refuse_early, write_headers
from app.protocol.retention import parse_retention
from app.protocol.target import StreamTarget
from app.service.engine import Engine
from app.state_machine import streams as rules
from app.state_machine.commands import Append, Code, CreateStream, DeleteStream, Outcome
from app.state_machine.reader import MAX_JSON_SUB_OFFSET
from app.tiering.keys import check_storable


def _require_bucket(engine: Engine, target: StreamTarget) -> None:
    if not engine.bucket_exists(target.bucket):
        raise missing_bucket(target.bucket)


async def _evicted_record(engine: Engine, target: StreamTarget, source: str | None, pos: int | None) -> bytes | None:
    """The fork point's record, fetched from the object store when it is no longer on local disk."""
    meta = engine.lookup(target.bucket, source) if source is not None else None
    if meta is None:
        return None
    return await engine.evicted_record(meta, meta.tail if pos is None else pos)


def _earliest(engine: Engine, target: StreamTarget, source: str | None) -> int:
    """Where a fork at -1 starts: the source's earliest retained offset, resolved here so that the
    command names an offset (retention moving past it before the apply refuses the fork, as for any)."""
    meta = engine.lookup(target.bucket, source) if source is not None else None
    return meta.earliest if meta is not None else 0


async def create(engine: Engine, call: Call, target: StreamTarget) -> Reply:
    h = call.headers
    ttl = parse_ttl(h.get("stream-ttl"))
    expires_at = parse_expires_at(h.get("stream-expires-at"))
    if ttl is not None and expires_at is not None:
        raise bad_request("send Stream-TTL or Stream-Expires-At, not both", "conflicting_expiry")
    closed = parse_flag(h, "stream-closed")
    fork_from, fork_offset_raw = h.get("stream-forked-from"), h.get("stream-fork-offset")
    sub_raw = h.get("stream-fork-sub-offset")
    if fork_from is None and (fork_offset_raw is not None or sub_raw is not None):
        raise bad_request("fork offsets need Stream-Forked-From", "invalid_fork")
    fork_sub = parse_sub_offset(sub_raw)
    attrs = parse_attrs(h["stream-attrs"].encode("latin-1")) if "stream-attrs" in h else b""
    retention_age, retention_bytes = parse_retention(h.get("stream-retention"))
    fork_name = target.resolve(fork_from) if fork_from is not None else None
    fork_offset = None
    if fork_offset_raw is not None and fork_offset_raw != "now":
        fork_offset = (
            _earliest(engine, target, fork_name) if fork_offset_raw == "-1" else parse_position(fork_offset_raw)
        )
    content_type = h.get("content-type")
    _require_bucket(engine, target)
    check_storable(engine.store, target.bucket, target.name)
    if fork_name is not None and content_type is None:
        source = engine.lookup(target.bucket, fork_name)
        is_json = source is not None and source.json
    else:
        is_json = media_type(content_type or DEFAULT_CONTENT_TYPE) == JSON
    if is_json and fork_sub > MAX_JSON_SUB_OFFSET:  # the apply would refuse it too: not worth a log entry
        message = f"Stream-Fork-Sub-Offset into a JSON record may be at most {MAX_JSON_SUB_OFFSET} messages"
        raise bad_request(message, "invalid_fork_sub_offset")
    body: Body = await read_buffer(call, engine.limits.max_body_bytes, engine.body_budget)
    if body and is_json:
        body = json_record(body, allow_empty=True)
    evicted_record = await _evicted_record(engine, target, fork_name, fork_offset) if fork_sub else None
    command = CreateStream(
        bucket=target.bucket,
        stream=target.name,
        content_type=content_type or DEFAULT_CONTENT_TYPE,
        json=is_json,
        ttl=ttl,
        expires_at=expires_at,
        closed=closed,
        body=memoryview(body),
        fork_stream=fork_name,
        fork_offset=fork_offset,
        fork_sub=fork_sub,
        content_type_given=content_type is not None,
        touched=engine.touched_at(target.bucket, target.name),
        source_touched=engine.touched_at(target.bucket, fork_name) if fork_name is not None else 0,
        evicted_record=evicted_record,
        attrs=attrs,
        retention_age=retention_age,
        retention_bytes=retention_bytes,
    )
    del body  # as in `append`: the entry holds the bytes once submitted
    await refuse_early(engine, lambda: rules.create_refusal(engine.table, command, engine.now_ms()))
    outcome = await engine.submit(command)
    raise_for(outcome)
    meta = engine.stream(outcome.sid)
    headers = write_headers(outcome)
    headers["content-type"] = meta.content_type if meta else content_type or DEFAULT_CONTENT_TYPE
    if outcome.code is Code.CREATED:
        headers["location"] = absolute_url(call, engine)
        return Reply(201, headers)
    return Reply(200, headers)


async def append(engine: Engine, call: Call, target: StreamTarget) -> Reply:
    h = call.headers
    producer = parse_producer(h)
    close = parse_flag(h, "stream-closed")
    stream_seq = parse_stream_seq(h.get("stream-seq"))
    body: Body = await read_buffer(call, engine.limits.max_body_bytes, engine.body_budget)
    content_type = h.get("content-type")
    if body:
        if content_type is None:
            raise bad_request("Content-Type is required to append", "missing_content_type")
    elif not close:
        raise bad_request("an append needs a body (or Stream-Closed: true)", "empty_body")
    _require_bucket(engine, target)
    command = Append(
        target.bucket,
        target.name,
        content_type if body else None,
        memoryview(body),
        stream_seq,
        producer,
        close,
        touched=engine.touched_at(target.bucket, target.name),
    )
    del body  # the engine drops the command's reference once the entry holds the bytes
    refused = rules.append_refusal(engine.table, command, engine.now_ms(), duplicates=True)  # the hot path checks once
    if refused is not None:
        # A producer's retry of an applied (so committed) append is answered here as the apply would:
        # it adds nothing, so nothing is proposed, and no quota or disk check refuses it (a client told
        # its stored append failed might send it again under a new seq).
        if refused.code is Code.DUPLICATE and (
            duplicate := await confirmed(engine, lambda: _duplicate(engine, command))
        ):
            return Reply(204, write_headers(duplicate))
        await refuse_early(engine, lambda: rules.append_refusal(engine.table, command, engine.now_ms()))
    # After the refusals, which look only at whether there is a body: as in the reference server, a
    # missing or closed stream, or one of another content type, is answered so whatever the body holds.
    if command.body and media_type(command.content_type or "") == JSON:
        command.body = memoryview(json_record(command.body, allow_empty=False))
    outcome = await engine.submit(command)
    raise_for(outcome)
    return Reply(200 if outcome.fresh_producer else 204, write_headers(outcome))


def _duplicate(engine: Engine, command: Append) -> Outcome | None:
    found = rules.append_refusal(engine.table, command, engine.now_ms(), duplicates=True)
    return found if found is not None and found.code is Code.DUPLICATE else None


async def delete(engine: Engine, target: StreamTarget) -> Reply:
    _require_bucket(engine, target)
    command = DeleteStream(target.bucket, target.name, touched=engine.touched_at(target.bucket, target.name))
    await refuse_early(engine, lambda: rules.delete_refusal(engine.table, command, engine.now_ms()))
    raise_for(await engine.submit(command))
    return Reply(204)
