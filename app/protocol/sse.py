"""Live reads over Server-Sent Events.

A reader behind the tail catches up on its own, one chunk at a time. At the tail it joins its
stream's feed (app/protocol/fanout.py), which writes each new batch to all its subscribers at once.
The response ends after the closing control of a closed stream, and about every `sse_max_seconds`
so clients reconnect (and CDNs can collapse).

Every control event carries the cursor the request's own cursor gives (the protocol's rule), so
subscribers without one, or with an old one, share their control events.
"""

from __future__ import annotations

import asyncio

from starlette.types import Send

from app.domain.errors import LeaderOnly, ProtocolError
from app.domain.headers import SECURITY_HEADERS
from app.protocol.cursor import next_cursor
from app.protocol.fanout import DirectSink, Fanout, QueueSink, Release, Subscriber
from app.protocol.headers import parse_uint
from app.protocol.http import Call, watch_disconnect
from app.protocol.reads import ReadRequest, checked_position, live_seconds, render_body
from app.protocol.sse_events import control_event, data_event, is_binary
from app.protocol.target import StreamTarget
from app.service.engine import Engine
from app.serving.cycle import EXTENSION as CHUNKS_EXTENSION  # direct writes to the connection


async def serve(engine: Engine, hub: Fanout, call: Call, target: StreamTarget, read: ReadRequest, send: Send) -> None:
    """Answers an SSE read. Errors before the response starts raise ProtocolError for the caller."""
    meta = await engine.find_latest(target.bucket, target.name)
    pos = checked_position(engine, meta, read.offset)
    engine.renew(meta)
    binary = is_binary(meta.content_type)
    headers = [
        (b"content-type", b"text/event-stream"),
        (b"cache-control", b"no-cache"),
        (b"x-accel-buffering", b"no"),  # proxies such as nginx must not hold events back
        *SECURITY_HEADERS,
    ]
    if binary:
        headers.append((b"stream-sse-data-encoding", b"base64"))
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    disconnect = watch_disconnect(call.receive)
    try:
        await _stream(engine, hub, call, target, read, meta.sid, pos, binary, send, disconnect)
    finally:
        disconnect.cancel()
    await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _stream(
    engine: Engine,
    hub: Fanout,
    call: Call,
    target: StreamTarget,
    read: ReadRequest,
    sid: int,
    pos: int,
    binary: bool,
    send: Send,
    disconnect: asyncio.Future[None],
) -> None:
    """`sid` is the stream the reader opened: one deleted and made again under its name meanwhile is
    another stream, and the response ends rather than go on in it from this offset."""
    loop = asyncio.get_running_loop()
    limit = engine.limits.sse_max_seconds
    allowed = live_seconds(engine, read, limit)
    expiring = allowed < limit  # the reader's token runs out before the usual end
    deadline = loop.time() + allowed
    announced = False
    while not disconnect.done():
        if loop.time() >= deadline:
            if expiring:  # do not hold a reader past its credentials: a last control, then close
                await _send(send, control_event(pos, _cursor(engine, read), False, False))
            return
        try:
            meta = engine.find(target.bucket, target.name)
            if meta.sid != sid:
                return
            chunk = await engine.read(meta, pos)
        except (ProtocolError, LeaderOnly):  # the response has started: end it, the client reconnects
            return
        at_tail = chunk.next_pos >= meta.tail
        closed = meta.closed and at_tail
        if chunk.payloads:
            pos = chunk.next_pos
            body = render_body(meta, chunk)
            await _send(send, data_event(body, binary) + control_event(pos, _cursor(engine, read), at_tail, closed))
            announced = True
            if closed:
                return
            continue
        if closed:
            await _send(send, control_event(pos, None, True, True))
            return
        if not announced:
            await _send(send, control_event(pos, _cursor(engine, read), True, False))
            announced = True
            continue  # the stream may have changed while we were suspended
        released, pos = await _follow(
            engine, hub, call, meta.sid, pos, parse_uint(read.cursor), send, disconnect, deadline
        )
        if released is None or released is Release.CATCH_UP:
            continue
        return


async def _follow(
    engine: Engine,
    hub: Fanout,
    call: Call,
    sid: int,
    pos: int,
    cursor: int | None,
    send: Send,
    disconnect: asyncio.Future[None],
    deadline: float,
) -> tuple[Release | None, int]:
    """Waits at the tail in the stream's feed; returns why it let us go (None: the deadline), and
    the position the feed brought us to."""
    writer = call.scope.get("extensions", {}).get(CHUNKS_EXTENSION)
    queue = None if writer is not None and writer.ready else QueueSink()
    sub = Subscriber(pos, cursor, queue if queue is not None else DirectSink(writer))
    meta = engine.stream(sid)
    assert meta is not None  # no await since the read that found it
    hub.join(meta, sub)  # no await since the read that found us at the tail: no apply slipped by
    pump = asyncio.ensure_future(queue.pump(send)) if queue is not None else None
    try:
        timeout = max(0.0, deadline - asyncio.get_running_loop().time())
        await asyncio.wait((sub.done, disconnect), timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        hub.leave(sid, sub)
        if pump is not None and queue is not None:
            await queue.finish(pump)
    return (sub.done.result() if sub.done.done() else None), sub.pos


def _cursor(engine: Engine, read: ReadRequest) -> str:
    return next_cursor(engine.now_ms(), read.cursor)


async def _send(send: Send, event: bytes) -> None:
    await send({"type": "http.response.body", "body": event, "more_body": True})
