"""`POST /ds/{bucket}/{stream}/append-batch`: length-prefixed frames, each its own append, in one entry.

Body: frames of a 4-byte big-endian length then that many bytes; no empty frames, at most 1,000.
Bad framing appends nothing (400). Otherwise the answer is 200 with one result per frame.
"""

from __future__ import annotations

import struct

import msgspec

from app.domain.errors import ProtocolError, bad_request
from app.domain.media import media_type
from app.domain.offsets import format_offset
from app.protocol.bodies import json_record, read_body
from app.protocol.http import Call, Reply
from app.protocol.responses import NO_STORE, raise_for
from app.protocol.target import StreamTarget
from app.service.engine import Engine
from app.state_machine.commands import AppendBatch, Code, Outcome
from app.state_machine.outcomes import stream_outcome

MAX_FRAMES = 1000
_LENGTH = struct.Struct(">I")
_encoder = msgspec.json.Encoder()


def split_frames(body: bytes) -> list[bytes]:
    frames, at = [], 0
    while at < len(body):
        if at + _LENGTH.size > len(body):
            raise bad_request("a frame's 4-byte length is cut short", "invalid_framing")
        (length,) = _LENGTH.unpack_from(body, at)
        at += _LENGTH.size
        if length == 0:
            raise bad_request("frames may not be empty", "invalid_framing")
        if at + length > len(body):
            raise bad_request("a frame is shorter than its length says", "invalid_framing")
        frames.append(body[at : at + length])
        at += length
        if len(frames) > MAX_FRAMES:
            raise bad_request(f"at most {MAX_FRAMES} frames per batch", "too_many_frames")
    if not frames:
        raise bad_request("the batch holds no frames", "invalid_framing")
    return frames


_UNSUPPORTED = ("producer-id", "producer-epoch", "producer-seq", "stream-seq", "stream-closed")


async def append_batch(engine: Engine, call: Call, target: StreamTarget) -> Reply:
    # Appending anyway, without the deduplication or closure they ask for, would be worse than refusing.
    if any(name in call.headers for name in _UNSUPPORTED):
        raise bad_request(
            "append-batch takes no Producer-*, Stream-Seq or Stream-Closed headers: send those with a plain append",
            "unsupported_header",
        )
    frames = split_frames(await read_body(call, engine.limits.max_body_bytes, engine.body_budget))
    meta = engine.find(target.bucket, target.name)
    content_type = call.headers.get("content-type")
    if content_type is not None and media_type(content_type) != media_type(meta.content_type):
        raise ProtocolError(409, Code.CONTENT_TYPE_MISMATCH.value, "content type does not match the stream")
    results: list[dict[str, object] | None] = [None] * len(frames)
    bodies, where = [], []
    for i, frame in enumerate(frames):
        try:
            bodies.append(bytes(json_record(frame, allow_empty=False)) if meta.json else frame)
            where.append(i)
        except ProtocolError as exc:
            results[i] = {"status": exc.status, "error": exc.code}
    if bodies and meta.closed:  # every frame is refused: no log entry (confirmed, as a new leader may lag)
        await engine.read_barrier()
        meta = engine.find(target.bucket, target.name)
    if bodies and meta.closed:
        closed = _result(stream_outcome(Code.STREAM_CLOSED, meta, "stream is closed"))
        for i in where:
            results[i] = closed
    elif bodies:
        touched = engine.touched_at(target.bucket, target.name)
        outcome = await engine.submit(AppendBatch(target.bucket, target.name, content_type, bodies, touched))
        raise_for(outcome)
        for i, each in zip(where, outcome.batch or [], strict=True):
            results[i] = _result(each)
    return Reply(200, {"content-type": "application/json", "cache-control": NO_STORE}, _encoder.encode(results))


def _result(outcome: Outcome) -> dict[str, object]:
    try:
        raise_for(outcome)
    except ProtocolError as exc:
        return {"status": exc.status, "error": exc.code, "next_offset": format_offset(outcome.next_pos)}
    return {"status": 204, "next_offset": format_offset(outcome.next_pos)}
