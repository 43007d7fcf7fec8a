"""`/ds/{bucket}` and `/ds/{bucket}/{stream}`: the primary family, with buckets."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from app.protocol.buckets import handle_bucket, validate_bucket
from app.protocol.errors import ProtocolError, render_error
from app.protocol.streams import METHODS, handle_stream
from app.protocol.target import DS_SUBROUTES, StreamTarget, validate_stream_id


async def bucket(request: Request) -> Response:
    return await handle_bucket(request.app.state.engine, request, request.path_params["bucket"])


async def stream(request: Request) -> Response:
    bucket_id, name = request.path_params["bucket"], request.path_params["path"]
    try:
        validate_bucket(bucket_id)
        validate_stream_id(name, reserved=DS_SUBROUTES)
    except ProtocolError as exc:
        return render_error(exc)
    target = StreamTarget(bucket_id, name, f"/ds/{bucket_id}/")
    return await handle_stream(request.app.state.engine, request, target)


routes = [
    Route("/ds/{bucket}", bucket, methods=METHODS),
    Route("/ds/{bucket}/{path:path}", stream, methods=METHODS),
]
