"""Live reads over Server-Sent Events.

Each batch of data is an `event: data` followed by an `event: control`
carrying the next offset and cursor. Binary streams send base64 data. The
server ends the response after the closing control of a closed stream, and
about every `sse_max_seconds` so clients reconnect (and CDNs can collapse).
"""

from __future__ import annotations

import base64
import re
import time
from collections.abc import AsyncIterator

import msgspec
from sse_starlette.sse import EventSourceResponse

from app.domain.errors import ProtocolError
from app.domain.media import media_type
from app.domain.offsets import format_offset
from app.node import Engine
from app.protocol.cursor import next_cursor
from app.protocol.http import SECURITY_HEADERS
from app.protocol.reads import ReadRequest, checked_position, live_seconds, render_body
from app.protocol.target import StreamTarget

_LINES = re.compile(rb"\r\n|\r|\n")
_json = msgspec.json.Encoder()


def is_binary(content_type: str) -> bool:
    media = media_type(content_type)
    return not (media.startswith("text/") or media == "application/json")


def data_event(payload: bytes, binary: bool) -> bytes:
    if binary:
        return b"event: data\ndata:" + base64.b64encode(payload) + b"\n\n"
    lines = _LINES.split(payload)
    return b"event: data\n" + b"".join(b"data:" + line + b"\n" for line in lines) + b"\n"


def control_event(next_pos: int, cursor: str | None, up_to_date: bool, closed: bool) -> bytes:
    control: dict[str, object] = {"streamNextOffset": format_offset(next_pos)}
    if closed:
        control["streamClosed"] = True
        control["upToDate"] = True
    else:
        control["streamCursor"] = cursor
        if up_to_date:
            control["upToDate"] = True
    return b"event: control\ndata:" + _json.encode(control) + b"\n\n"


async def sse(engine: Engine, target: StreamTarget, read: ReadRequest) -> EventSourceResponse:
    meta = await engine.find_latest(target.bucket, target.name)
    pos = checked_position(engine, meta, read.offset)
    engine.renew(meta)
    binary = is_binary(meta.content_type)
    headers = {"content-type": "text/event-stream", "cache-control": "no-cache"}
    headers.update({k.decode(): v.decode() for k, v in SECURITY_HEADERS})
    if binary:
        headers["stream-sse-data-encoding"] = "base64"
    return EventSourceResponse(
        _events(engine, target, pos, read, binary),
        headers=headers,
        media_type=None,  # type: ignore[arg-type]  # our content-type header, without a charset
        ping=engine.limits.sse_ping_seconds,
        sep="\n",
    )


async def _events(
    engine: Engine, target: StreamTarget, pos: int, read: ReadRequest, binary: bool
) -> AsyncIterator[bytes]:
    cursor = read.cursor
    limit = engine.limits.sse_max_seconds
    allowed = live_seconds(engine, read, limit)
    expiring = allowed < limit  # the reader's token runs out before the usual end
    deadline = time.monotonic() + allowed
    announced = False
    while True:
        if time.monotonic() >= deadline:
            if expiring:  # do not hold a reader past its credentials: a last control, then close
                yield control_event(pos, next_cursor(engine.now_ms(), cursor), False, False)
            return
        try:
            meta = engine.find(target.bucket, target.name)
            chunk = await engine.read(meta, pos)
        except ProtocolError:
            return
        at_tail = chunk.next_pos >= meta.tail
        closed = meta.closed and at_tail
        if chunk.payloads:
            cursor = next_cursor(engine.now_ms(), cursor)
            pos = chunk.next_pos
            body = render_body(meta, chunk)
            yield data_event(body, binary) + control_event(pos, cursor, at_tail, closed)
            announced = True
            if closed:
                return
            continue
        if closed:
            yield control_event(pos, None, True, True)
            return
        if not announced:
            cursor = next_cursor(engine.now_ms(), cursor)
            yield control_event(pos, cursor, True, False)
            announced = True
            continue  # the stream may have changed while we were suspended
        await engine.signals.wait(meta.sid, max(0.0, deadline - time.monotonic()))
