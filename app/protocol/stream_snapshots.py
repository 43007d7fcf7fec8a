"""`/ds/{bucket}/{stream}/snapshot[/{offset}]`: applications publish their state at an offset.

Blobs up to INLINE_MAX_BYTES live in the replicated state; larger ones are uploaded to the object
store first, content-addressed under the stream, and only then proposed.
"""

from __future__ import annotations

import hashlib
from urllib.parse import quote

from app.domain.errors import ProtocolError
from app.domain.media import DEFAULT_CONTENT_TYPE
from app.domain.offsets import format_offset, parse_position
from app.protocol.bodies import read_body
from app.protocol.http import Call, Reply
from app.protocol.responses import CACHE_PRIVATE, CACHE_PUBLIC, NO_STORE, etag_matches, raise_for, refuse_early
from app.protocol.target import StreamTarget
from app.runtime import blocking
from app.service.engine import Engine
from app.state_machine import history as rules
from app.state_machine.commands import Code, DeleteSnapshot, PublishSnapshot
from app.state_machine.records import PublishedSnapshot, StreamMeta
from app.tiering.segment import stream_dir
from app.tiering.store import StoreUnavailable

INLINE_MAX_BYTES = 256 * 1024


def digest_header(sha256: str) -> str:
    return f"sha256:{sha256}"


def snapshot_key(bucket: str, stream: str, sha256: str) -> str:
    return f"{stream_dir(bucket, stream)}/snapshots/{sha256}.bin"


def _headers(pos: int, sha256: str, meta: StreamMeta) -> dict[str, str]:
    return {
        "stream-snapshot-offset": format_offset(pos),
        "stream-snapshot-digest": digest_header(sha256),
        "stream-next-offset": format_offset(meta.tail),
    }


async def publish(engine: Engine, call: Call, target: StreamTarget, token: str) -> Reply:
    pos = parse_position(token)
    body = await read_body(call, engine.limits.snapshot_max_bytes, engine.body_budget)
    engine.find(target.bucket, target.name)
    sha256 = hashlib.sha256(body).hexdigest()
    match = call.headers.get("stream-snapshot-match")
    command = PublishSnapshot(
        target.bucket,
        target.name,
        pos,
        call.headers.get("content-type") or DEFAULT_CONTENT_TYPE,
        sha256,
        len(body),
        match=match.removeprefix("sha256:").strip() if match is not None else None,
        touched=engine.touched_at(target.bucket, target.name),
    )
    # Refused before the upload too: a refused one would leave its object behind until collected.
    await refuse_early(engine, lambda: rules.publish_refusal(engine.table, command, engine.now_ms()))
    if len(body) <= INLINE_MAX_BYTES:
        command.inline = body
        outcome = await engine.submit(command)
    else:
        if engine.quotas is not None:
            engine.quotas.check(command, engine.now_ms())
        command.key = snapshot_key(target.bucket, target.name, sha256)
        async with engine.uploading_key(command.key):
            await _upload(engine, command.key, body)
            outcome = await engine.submit(command)
    raise_for(outcome)
    meta = engine.find(target.bucket, target.name)
    return Reply(201 if outcome.code is Code.CREATED else 204, _headers(pos, sha256, meta))


async def _upload(engine: Engine, key: str, body: bytes) -> None:
    store = engine.store
    try:
        if store is None:
            raise StoreUnavailable("no object store is configured")
        await blocking.run("snapshots", store.put, key, body)
        info = await blocking.run("snapshots", store.stat, key)
        if info is None or info.size != len(body):
            raise StoreUnavailable(f"uploaded {key} but the store holds something else")
    except StoreUnavailable:
        raise ProtocolError(
            503, "cold_tier_unavailable", "the object store for large snapshots is unavailable", {"retry-after": "2"}
        ) from None


async def latest(engine: Engine, target: StreamTarget) -> Reply:
    meta = await engine.find_latest(target.bucket, target.name)
    if meta.latest_snapshot is None:
        raise ProtocolError(404, Code.SNAPSHOT_NOT_FOUND.value, "the stream has no snapshot")
    location = f"{target.base}{quote(target.name)}/snapshot/{format_offset(meta.latest_snapshot)}"
    if engine.limits.public_url:  # relative otherwise: it names this node at whatever address the client used
        location = engine.limits.public_url + location
    return Reply(307, {"location": location, "cache-control": NO_STORE})


async def fetch(
    engine: Engine, target: StreamTarget, token: str, private: bool = False, if_none_match: str | None = None
) -> Reply:
    pos = parse_position(token)
    meta, snapshot = await _find_snapshot(engine, target, pos)
    engine.renew(meta)  # a read of the stream's state: it renews a sliding TTL as reads do
    headers = _headers(pos, snapshot.sha256, meta)
    headers["etag"] = f'"{snapshot.sha256}"'
    # The snapshot at an offset does not change while it exists (another one there is a conflict).
    headers["cache-control"] = CACHE_PRIVATE if private else CACHE_PUBLIC
    if etag_matches(if_none_match, headers["etag"]):
        return Reply(304, headers)  # the client has it: no fetch from the object store
    headers["content-type"] = snapshot.content_type
    return Reply(200, headers, await blob(engine, snapshot))


async def _find_snapshot(engine: Engine, target: StreamTarget, pos: int) -> tuple[StreamMeta, PublishedSnapshot]:
    meta = engine.find(target.bucket, target.name)
    snapshot = engine.snapshot_at(meta.sid, pos)
    if snapshot is None:  # perhaps published but not applied here yet
        meta = await engine.find_latest(target.bucket, target.name)
        snapshot = engine.snapshot_at(meta.sid, pos)
    if snapshot is None:
        raise ProtocolError(404, Code.SNAPSHOT_NOT_FOUND.value, "no snapshot at this offset")
    return meta, snapshot


async def blob(engine: Engine, snapshot: PublishedSnapshot) -> bytes:
    if snapshot.inline is not None:
        return snapshot.inline
    assert snapshot.key is not None
    try:
        if engine.store is None:
            raise StoreUnavailable("no object store is configured")
        data = await blocking.run("snapshots", engine.store.get, snapshot.key)
    except (StoreUnavailable, KeyError):
        data = b""
    if hashlib.sha256(data).hexdigest() != snapshot.sha256:
        raise ProtocolError(
            503, "cold_tier_unavailable", "the snapshot's blob cannot be read now", {"retry-after": "2"}
        )
    return data


async def delete(engine: Engine, target: StreamTarget, token: str) -> Reply:
    pos = parse_position(token)
    engine.find(target.bucket, target.name)
    command = DeleteSnapshot(target.bucket, target.name, pos, engine.touched_at(target.bucket, target.name))
    await refuse_early(engine, lambda: rules.delete_refusal(engine.table, command, engine.now_ms()))
    raise_for(await engine.submit(command))
    return Reply(204, {})
