"""`GET /ds/{bucket}/{stream}/__ds/records?offset=`: whole records with their metadata, as Arrow IPC.

A catch-up read flattens records into bytes (or a JSON array of messages). Readers that need each
append as it was made (where it starts and ends, when it was appended, by which producer), such as
Spark's reader of the part not tiered yet, read this instead. Its rows have the schema of the cold
tier's segments, so a reader treats both tiers alike. Rows are the appends that start at or after
`offset`. It serves what this node holds locally: records already evicted to the object store
answer 409 with `Stream-Tiered-Offset`, where that evicted run ends, and are read from their
segments: the stream's own, or for what a fork inherited, its source's (`Stream-Tiered-Stream`).
"""

from __future__ import annotations

from urllib.parse import quote

from app.domain.errors import ProtocolError, bad_request
from app.domain.offsets import format_offset
from app.protocol.headers import parse_uint, single_query
from app.protocol.http import Call, Reply
from app.protocol.reads import start_position
from app.protocol.responses import NO_STORE
from app.protocol.target import StreamTarget
from app.service.engine import Engine
from app.state_machine import records as r
from app.tiering.segment import Record, arrow_stream

MEDIA_TYPE = "application/vnd.apache.arrow.stream"
MAX_LIMIT = 100_000


async def get_records(engine: Engine, call: Call, target: StreamTarget) -> Reply:
    if "live" in call.query:
        raise bad_request("the records route is not a live read; poll from Stream-Next-Offset", "invalid_live")
    meta = await engine.find_latest(target.bucket, target.name)
    # Any offset will do: rows are the appends that start at or after it, so a reader may split a
    # stream at any position and read each append exactly once.
    pos = start_position(meta, single_query(call.query, "offset"))
    limit = single_query(call.query, "limit")
    most = parse_uint(limit) if limit is not None else 0
    if most is None or (limit is not None and not 1 <= most <= MAX_LIMIT):
        raise bad_request(f"limit must be an integer from 1 to {MAX_LIMIT}", "invalid_limit")
    found = engine.local_records(meta, pos, most)
    if found is None:
        holder, upto = engine.evicted_span(meta, pos)
        headers = {"stream-tiered-offset": format_offset(upto)}
        if holder is not meta:  # a fork's inherited records: in its source's segments
            headers["stream-tiered-stream"] = quote(holder.name, safe="/")
        message = "these records are only in the object store now: read them from its segments"
        raise ProtocolError(409, "records_tiered", message, headers)
    stored, next_pos = found
    rows = [Record(p, r.record_time(v), r.record_payload(v), r.record_producer(v)) for p, v in stored]
    headers = {"content-type": MEDIA_TYPE, "stream-next-offset": format_offset(next_pos), "cache-control": NO_STORE}
    if next_pos >= meta.tail:
        headers["stream-up-to-date"] = "true"
        if meta.closed:
            headers["stream-closed"] = "true"
    engine.renew(meta)
    return Reply(200, headers, arrow_stream(meta.bucket, meta.name, meta.content_type, rows))
