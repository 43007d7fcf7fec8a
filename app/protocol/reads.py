"""HEAD, catch-up GET and long-poll GET."""

from __future__ import annotations

from dataclasses import dataclass

from app.domain.errors import ProtocolError, bad_request, missing_stream
from app.domain.offsets import format_offset, parse_offset
from app.protocol.cursor import next_cursor
from app.protocol.headers import single_query
from app.protocol.http import Call, Reply, watch_disconnect
from app.protocol.responses import (
    CACHE_PRIVATE,
    CACHE_PUBLIC,
    NO_STORE,
    etag,
    etag_matches,
    metadata_headers,
    trimmed,
)
from app.protocol.target import StreamTarget
from app.service.engine import Engine
from app.state_machine.reader import Chunk
from app.state_machine.records import StreamMeta

LIVE_MODES = (None, "long-poll", "sse")


@dataclass
class ReadRequest:
    offset: str | None
    live: str | None
    cursor: str | None
    expires_at: int | None = None  # live reads end when the caller's token does
    private: bool = False


def parse_read(call: Call) -> ReadRequest:
    params = call.query
    offset = single_query(params, "offset")
    live = single_query(params, "live")
    if live not in LIVE_MODES:
        raise bad_request("live must be long-poll or sse", "invalid_live")
    if live is not None and offset is None:
        raise bad_request("live reads need an offset", "missing_offset")
    return ReadRequest(offset, live, single_query(params, "cursor"), call.expires_at, call.private)


def live_seconds(engine: Engine, read: ReadRequest, limit: float) -> float:
    """How long a live read may wait: `limit`, or less when the caller's token expires sooner."""
    if read.expires_at is None:
        return limit
    return max(0.0, min(limit, (read.expires_at - engine.now_ms()) / 1000))


def start_position(meta: StreamMeta, offset: str | None) -> int:
    if offset is None or offset == "-1":
        return meta.earliest  # the start of what retention has kept
    pos = parse_offset(offset, meta.tail)
    if pos > meta.tail:
        raise bad_request("offset is beyond the stream's tail", "offset_out_of_range")
    if pos < meta.earliest:
        raise trimmed(meta)
    return pos


def checked_position(engine: Engine, meta: StreamMeta, offset: str | None) -> int:
    pos = start_position(meta, offset)
    if meta.json and not engine.is_boundary(meta, pos):
        raise bad_request("offset is not a message boundary", "invalid_offset")
    return pos


async def head(engine: Engine, target: StreamTarget) -> Reply:
    meta = await engine.find_latest(target.bucket, target.name)
    return Reply(200, metadata_headers(meta))


async def _read(engine: Engine, target: StreamTarget, read: ReadRequest) -> tuple[StreamMeta, int, Chunk]:
    """The first chunk of a read. Data below this node's applied tail is served as it is; an answer
    that reaches the tail (or finds nothing) is confirmed with a read barrier first."""
    fresh = read.live is not None or read.offset == "now"
    if fresh:
        await engine.read_barrier()
    try:
        meta = engine.find(target.bucket, target.name)
        pos = checked_position(engine, meta, read.offset)
        chunk = await engine.read(meta, pos)
        stale = chunk.next_pos >= meta.tail
    except ProtocolError:
        if fresh:
            raise
        stale = True  # perhaps only not applied here yet
    if stale and not fresh:
        await engine.read_barrier()
        meta = engine.find(target.bucket, target.name)
        pos = checked_position(engine, meta, read.offset)
        chunk = await engine.read(meta, pos)
    engine.renew(meta)
    return meta, pos, chunk


def render_body(meta: StreamMeta, chunk: Chunk) -> bytes:
    if meta.json:
        return b"[" + b",".join(chunk.payloads) + b"]"
    return b"".join(chunk.payloads)


async def get(engine: Engine, call: Call, target: StreamTarget, read: ReadRequest) -> Reply:
    meta, pos, chunk = await _read(engine, target, read)
    if read.live == "long-poll" and not chunk.payloads and not meta.closed:
        # Registered before any await, so an append applied meanwhile still wakes us; a client that
        # leaves ends the wait, so its connection slot is the bound of long-polls held.
        gone = watch_disconnect(call.receive)
        try:
            await engine.signals.wait(meta.sid, live_seconds(engine, read, engine.limits.long_poll_seconds), gone)
        finally:
            gone.cancel()  # a reply to a client that left is dropped by the edge
        found = engine.find(target.bucket, target.name)
        if found.sid != meta.sid:  # deleted and made again meanwhile: not the stream this read is of
            raise missing_stream()
        meta = found
        chunk = await engine.read(meta, pos)
    at_tail = chunk.next_pos >= meta.tail
    headers = {
        "content-type": meta.content_type,
        "stream-next-offset": format_offset(chunk.next_pos),
    }
    if at_tail:
        headers["stream-up-to-date"] = "true"
        if meta.closed:
            headers["stream-closed"] = "true"
    if read.live == "long-poll":
        headers["stream-cursor"] = next_cursor(engine.now_ms(), read.cursor)
        if not chunk.payloads:
            headers["cache-control"] = NO_STORE
            del headers["content-type"]
            return Reply(204, headers)
    if read.offset == "now":
        headers["cache-control"] = NO_STORE
        return Reply(200, headers, render_body(meta, chunk))
    tag = etag(meta, pos, chunk.next_pos, at_tail and meta.closed)
    headers["etag"] = tag
    # Data below the tail never changes; a read reaching the open tail must revalidate.
    cacheable = CACHE_PRIVATE if read.private else CACHE_PUBLIC
    headers["cache-control"] = cacheable if not at_tail or meta.closed or read.live else "no-cache"
    if etag_matches(call.headers.get("if-none-match"), tag):
        del headers["content-type"]
        return Reply(304, headers)
    return Reply(200, headers, render_body(meta, chunk))
