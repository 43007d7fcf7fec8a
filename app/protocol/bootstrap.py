"""`GET /ds/{bucket}/{stream}/bootstrap`: the latest snapshot and the messages after it, as multipart/mixed.

The first part is the snapshot (empty when there is none); then one part per message up to the tail,
or as far as fits in `bootstrap_max_bytes` of parts, after which the client reads on from
`Stream-Next-Offset`.
"""

from __future__ import annotations

import secrets

from app.domain.errors import bad_request
from app.domain.offsets import format_offset
from app.protocol.http import Call, Reply
from app.protocol.responses import NO_STORE
from app.protocol.stream_snapshots import blob, digest_header
from app.protocol.target import StreamTarget
from app.service.engine import Engine
from app.state_machine.reader import json_prefix, split_json_record


async def bootstrap(engine: Engine, call: Call, target: StreamTarget) -> Reply:
    if "live" in call.query:
        raise bad_request("bootstrap is not a live read; tail from Stream-Next-Offset afterwards", "invalid_live")
    meta = await engine.find_latest(target.bucket, target.name)
    headers = {"cache-control": NO_STORE}
    snapshot = None
    if meta.latest_snapshot is not None:
        snapshot = engine.snapshot_at(meta.sid, meta.latest_snapshot)
    if snapshot is not None and meta.latest_snapshot is not None:
        first = (snapshot.content_type, await blob(engine, snapshot))
        pos = meta.latest_snapshot
        headers["stream-snapshot-offset"] = format_offset(pos)
        headers["stream-snapshot-digest"] = digest_header(snapshot.sha256)
    else:
        first = ("application/octet-stream", b"")
        pos = meta.earliest
        headers["stream-snapshot-offset"] = "-1"
    parts = [first]
    message_type = "application/json" if meta.json else meta.content_type
    boundary = "rill-" + secrets.token_hex(12)
    overhead = len(_head(boundary, message_type, 0)) + 20 + 2  # a part's head (any length), and its CRLF
    # The snapshot's bytes aside, the response's own framing counts: the first part's head and CRLF,
    # and the closing delimiter.
    framing = len(_head(boundary, first[0], len(first[1]))) + 2 + len(_closing(boundary))
    room = engine.limits.bootstrap_max_bytes - framing
    full = False
    while pos < meta.tail and not full and room > overhead:
        chunk = await engine.read(meta, pos, whole_records=True, max_bytes=room)
        if not chunk.payloads:
            break
        for payload in chunk.payloads:
            # A part per message: a record of tiny JSON messages costs far more as parts than as
            # bytes. A record that would pass the limit waits for a plain read, even the first: the
            # response stays within the limit whatever the records.
            data = bytes(payload)
            if len(data) + overhead > room or (meta.json and not _parts_fit(data, (room - len(data)) // overhead)):
                full = True
                break
            messages = split_json_record(data) if meta.json else [data]
            parts.extend((message_type, m) for m in messages)
            cost = len(data) + overhead * len(messages)
            room -= cost
            pos += len(data)
    engine.renew(meta)  # a read, as any other: it renews a sliding TTL
    headers["stream-next-offset"] = format_offset(pos)
    if pos >= meta.tail:
        headers["stream-up-to-date"] = "true"
        if meta.closed:
            headers["stream-closed"] = "true"
    headers["content-type"] = f"multipart/mixed; boundary={boundary}"
    return Reply(200, headers, multipart(boundary, parts))


WALK_AT_MOST = 4096  # messages: a walk costs about 2 µs each, on the event loop


def _parts_fit(record: bytes, most: int) -> bool:
    """Whether the JSON record holds at most `most` messages. A comma count bounds it without a walk,
    but commas inside strings and objects count too: the messages are then walked, when there are
    few enough to walk (else the record waits for a plain read, as one that does not fit)."""
    if record.count(b",") < most:
        return True
    return most < WALK_AT_MOST and json_prefix(record, most + 1) is None


def _closing(boundary: str) -> bytes:
    return f"--{boundary}--\r\n".encode("latin-1")


def _head(boundary: str, content_type: str, length: int) -> bytes:
    return f"--{boundary}\r\ncontent-type: {content_type}\r\ncontent-length: {length}\r\n\r\n".encode("latin-1")


def multipart(boundary: str, parts: list[tuple[str, bytes]]) -> bytes:
    out = []
    for content_type, body in parts:
        out += [_head(boundary, content_type, len(body)), body, b"\r\n"]
    out.append(_closing(boundary))
    return b"".join(out)
