"""One entry point per stream request, whatever route family it came through."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from app.protocol import reads, sse, writes
from app.protocol.engine import Engine
from app.protocol.errors import ProtocolError, render_error
from app.protocol.target import StreamTarget

METHODS = ["GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS"]
ALLOWED = ", ".join(METHODS)


async def handle_stream(engine: Engine, request: Request, target: StreamTarget) -> Response:
    try:
        method = request.method
        if method == "POST":
            return await writes.append(engine, request, target)
        if method == "GET":
            read = reads.parse_read(request)
            if read.live == "sse":
                return await sse.sse(engine, request, target, read)
            return await reads.get(engine, request, target, read)
        if method == "HEAD":
            return await reads.head(engine, request, target)
        if method == "PUT":
            return await writes.create(engine, request, target)
        if method == "DELETE":
            return await writes.delete(engine, request, target)
        return Response(status_code=204, headers={"allow": ALLOWED})
    except ProtocolError as exc:
        return render_error(exc)
