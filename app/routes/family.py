"""A route family that maps every path under a prefix to streams of one built-in bucket."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from app.protocol.errors import ProtocolError, render_error
from app.protocol.streams import METHODS, handle_stream
from app.protocol.target import StreamTarget, validate_stream_id


def builtin_bucket_routes(bucket: str, prefix: str) -> list[Route]:
    async def stream(request: Request) -> Response:
        name = request.path_params["path"]
        try:
            validate_stream_id(name)
        except ProtocolError as exc:
            return render_error(exc)
        return await handle_stream(request.app.state.engine, request, StreamTarget(bucket, name, prefix))

    return [Route(prefix + "{path:path}", stream, methods=METHODS)]
