"""Buckets of the /ds family: create, describe with a paged stream listing, delete when empty, and
the paged listing of buckets itself (`GET /ds`).

The route families' built-in buckets (`compat.v1`, `legacy.streams`) are listed and described here
too, read-only: their streams are made through their own families.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec
from starlette.types import Send

from app.domain.errors import bad_request, missing_bucket
from app.domain.names import BUCKET_ID
from app.domain.offsets import format_offset
from app.protocol.errors import answer, error_reply
from app.protocol.headers import format_expires_at, parse_uint, single_query
from app.protocol.http import Call, Reply
from app.protocol.responses import NO_STORE, raise_for
from app.protocol.retention import parse_retention
from app.service.engine import Engine
from app.state_machine.commands import Code, CreateBucket, DeleteBucket
from app.state_machine.table import BUILTIN_BUCKETS

ALLOWED = "GET, HEAD, PUT, DELETE, OPTIONS"
READ_ONLY = "GET, HEAD, OPTIONS"
SKIP_AT_MOST = 10_000  # deleted or expired streams a listing page passes over before it ends
_json = msgspec.json.Encoder()


def validate_bucket(bucket: str) -> None:
    if not BUCKET_ID.fullmatch(bucket):
        raise bad_request("bucket ids are 4 to 64 of a-z, 0-9, _ and -", "invalid_bucket_id")


async def serve_bucket(engine: Engine, call: Call, bucket: str, send: Send) -> None:
    await answer(call, send, _dispatch(engine, call, bucket))


async def serve_bucket_list(engine: Engine, call: Call, readable: frozenset[str] | None, send: Send) -> None:
    """`GET /ds`: the buckets the caller may read (`readable`; None: every bucket), in name order, paged.
    A page never names a bucket outside `readable`, its `next` included."""
    await answer(call, send, _list(engine, call, readable))


async def _list(engine: Engine, call: Call, readable: frozenset[str] | None) -> Reply:
    if call.method == "OPTIONS":
        return Reply(204, {"allow": READ_ONLY})
    if call.method not in ("GET", "HEAD"):
        return error_reply(405, "method_not_allowed", "the bucket listing is read-only", {"allow": READ_ONLY})
    prefix, after, limit = _page(call)
    await engine.read_barrier()
    created = engine.buckets()
    if readable is None:
        names: Iterable[str] = engine.bucket_names(max(prefix, after))
    else:  # as many as the caller's grants: sorted here rather than looked for among all buckets
        names = sorted(name for name in readable if name > after and name.startswith(prefix) and name in created)
    page: list[str] = []
    has_more, next_after = False, None
    for name in names:
        if name <= after:
            continue
        if not name.startswith(prefix):
            break  # in name order: past the prefix
        if len(page) == limit:
            has_more, next_after = True, page[-1]
            break
        page.append(name)
    body = {
        "buckets": [{"name": n, "created_at": _created(created[n]), "builtin": n in BUILTIN_BUCKETS} for n in page],
        "has_more": has_more,
        "next": next_after,
    }
    return Reply(200, {"content-type": "application/json", "cache-control": NO_STORE}, _json.encode(body))


def _page(call: Call) -> tuple[str, str, int]:
    """`prefix`, `after` and `limit` (1 to 1000, default 100) of a paged listing."""
    params = call.query
    limit = parse_uint(single_query(params, "limit") or "100")
    if limit is None or not 1 <= limit <= 1000:
        raise bad_request("limit must be an integer from 1 to 1000", "invalid_limit")
    return single_query(params, "prefix") or "", single_query(params, "after") or "", limit


async def _dispatch(engine: Engine, call: Call, bucket: str) -> Reply:
    if bucket not in BUILTIN_BUCKETS:
        validate_bucket(bucket)
    elif call.method in ("PUT", "DELETE"):
        message = f"{bucket} is a route family's built-in bucket: it is neither created nor deleted"
        return error_reply(405, "method_not_allowed", message, {"allow": READ_ONLY})
    if call.method == "PUT":
        age, size = parse_retention(call.headers.get("stream-retention"))
        outcome = await engine.submit(CreateBucket(bucket, age, size))
        return Reply(201 if outcome.code is Code.CREATED else 200)
    if call.method in ("GET", "HEAD"):
        await engine.read_barrier()  # listings reflect every committed create and delete
        return _describe(engine, call, bucket)
    if call.method == "DELETE":
        outcome = await engine.submit(DeleteBucket(bucket))
        if outcome.code is Code.BUCKET_NOT_FOUND:
            raise missing_bucket(bucket)
        raise_for(outcome)
        return Reply(204)
    if call.method == "OPTIONS":
        return Reply(204, {"allow": READ_ONLY if bucket in BUILTIN_BUCKETS else ALLOWED})
    return error_reply(405, "method_not_allowed", f"{call.method} is not supported on a bucket", {"allow": ALLOWED})


def _describe(engine: Engine, call: Call, bucket: str) -> Reply:
    created = engine.buckets().get(bucket)
    if created is None:
        raise missing_bucket(bucket)
    prefix, after, limit = _page(call)
    now = engine.now_ms()
    streams: list[dict[str, object]] = []
    has_more, next_after, skipped = False, None, 0
    for meta in engine.bucket_streams(bucket, prefix, after):
        if meta.deleted or meta.expired(now, engine.touched(meta.sid)):
            skipped += 1
            if skipped == SKIP_AT_MOST:  # a page ends early rather than skip without end
                has_more, next_after = True, meta.name
                break
            continue
        if len(streams) == limit:
            has_more, next_after = True, str(streams[-1]["name"])
            break
        streams.append(
            {
                "name": meta.name,
                "content_type": meta.content_type,
                "next_offset": format_offset(meta.tail),
                "earliest_offset": format_offset(meta.earliest),
                "closed": meta.closed,
                "created_at": format_expires_at(meta.created_at),
            }
        )
    body = {
        "bucket": bucket,
        "created_at": _created(created),
        "streams": streams,
        "has_more": has_more,
        "next": next_after,
    }
    return Reply(200, {"content-type": "application/json", "cache-control": NO_STORE}, _json.encode(body))


def _created(at: int) -> str | None:
    return format_expires_at(at) if at else None  # built-in buckets have no creation time
