"""One entry point per stream request, whatever route family it came through."""

from __future__ import annotations

from starlette.types import Send

from app.domain.errors import ProtocolError
from app.protocol import reads, sse, writes
from app.protocol.errors import error_reply, render_error
from app.protocol.fanout import Fanout
from app.protocol.http import Call, Reply, send_reply
from app.protocol.target import StreamTarget
from app.service.engine import Engine

ALLOWED = "GET, HEAD, POST, PUT, DELETE, OPTIONS"


async def serve_stream(engine: Engine, hub: Fanout, call: Call, target: StreamTarget, send: Send) -> None:
    """`hub` serves the SSE readers that reach the tail."""
    method = call.method
    try:
        if method == "GET":
            read = reads.parse_read(call)
            if read.live == "sse":
                await sse.serve(engine, hub, call, target, read, send)
                return
            reply = await reads.get(engine, call, target, read)
        else:
            reply = await _dispatch(engine, call, target, method)
    except ProtocolError as exc:
        reply = render_error(exc)
    await send_reply(send, reply, head_only=method == "HEAD")


async def _dispatch(engine: Engine, call: Call, target: StreamTarget, method: str) -> Reply:
    if method == "POST":
        return await writes.append(engine, call, target)
    if method == "HEAD":
        return await reads.head(engine, target)
    if method == "PUT":
        return await writes.create(engine, call, target)
    if method == "DELETE":
        return await writes.delete(engine, target)
    if method == "OPTIONS":
        return Reply(204, {"allow": ALLOWED})
    return error_reply(405, "method_not_allowed", f"{method} is not supported here", {"allow": ALLOWED})
