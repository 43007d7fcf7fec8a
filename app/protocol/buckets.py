"""Buckets of the /ds family: create, describe with a paged stream listing, delete when empty."""

from __future__ import annotations

import re

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from app.protocol.engine import Engine
from app.protocol.errors import ProtocolError, bad_request, error_response, render_error
from app.protocol.headers import format_expires_at, single_query
from app.protocol.offsets import format_offset
from app.protocol.responses import NO_STORE, raise_for
from app.state_machine.commands import Code, CreateBucket, DeleteBucket

BUCKET_ID = re.compile(r"[a-z0-9_-]{4,64}")
_json = msgspec.json.Encoder()


def validate_bucket(bucket: str) -> None:
    if not BUCKET_ID.fullmatch(bucket):
        raise bad_request("bucket ids are 4 to 64 of a-z, 0-9, _ and -", "invalid_bucket_id")


async def handle_bucket(engine: Engine, request: Request, bucket: str) -> Response:
    try:
        validate_bucket(bucket)
        if request.method == "PUT":
            outcome = await engine.submit(CreateBucket(bucket))
            return Response(status_code=201 if outcome.code is Code.CREATED else 200)
        if request.method in ("GET", "HEAD"):
            return _describe(engine, request, bucket)
        if request.method == "DELETE":
            outcome = await engine.submit(DeleteBucket(bucket))
            raise_for(outcome)
            return Response(status_code=204)
        if request.method == "OPTIONS":
            return Response(status_code=204, headers={"allow": "GET, HEAD, PUT, DELETE, OPTIONS"})
        return error_response(
            405, "method_not_allowed", "POST is not supported on a bucket", {"allow": "GET, HEAD, PUT, DELETE, OPTIONS"}
        )
    except ProtocolError as exc:
        return render_error(exc)


def _describe(engine: Engine, request: Request, bucket: str) -> Response:
    created = engine.machine.buckets.get(bucket)
    if created is None:
        raise ProtocolError(404, "bucket_not_found", f"bucket {bucket!r} does not exist")
    params = request.query_params
    prefix = single_query(params, "prefix") or ""
    after = single_query(params, "after") or ""
    raw_limit = single_query(params, "limit") or "100"
    if not raw_limit.isdigit() or not 1 <= int(raw_limit) <= 1000:
        raise bad_request("limit must be an integer from 1 to 1000", "invalid_limit")
    limit = int(raw_limit)
    streams = []
    has_more = False
    for meta in engine.machine.bucket_streams(bucket, prefix, after):
        if meta.deleted:
            continue
        if len(streams) == limit:
            has_more = True
            break
        streams.append(
            {
                "name": meta.name,
                "content_type": meta.content_type,
                "next_offset": format_offset(meta.tail),
                "closed": meta.closed,
                "created_at": format_expires_at(meta.created_at),
            }
        )
    body = {
        "bucket": bucket,
        "created_at": format_expires_at(created),
        "streams": streams,
        "has_more": has_more,
        "next": streams[-1]["name"] if has_more else None,
    }
    headers = {"content-type": "application/json", "cache-control": NO_STORE}
    return Response(_json.encode(body) if request.method == "GET" else b"", 200, headers)
