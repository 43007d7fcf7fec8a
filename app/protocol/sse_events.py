"""SSE event bytes: `event: data` with a batch, `event: control` with the next offset and cursor.

Binary streams send base64 data. A live subscriber's events are written as chunks of a chunked
HTTP response; `frame` makes the chunk once, to be written to every subscriber of a feed.
"""

from __future__ import annotations

import base64
import re

import msgspec

from app.domain.media import media_type
from app.domain.offsets import format_offset

_LINES = re.compile(rb"\r\n|\r|\n")
_json = msgspec.json.Encoder()

PING = b": ping\n\n"  # a comment: proxies see traffic, clients ignore it


def is_binary(content_type: str) -> bool:
    media = media_type(content_type)
    return not (media.startswith("text/") or media == "application/json")


def data_event(payload: bytes, binary: bool) -> bytes:
    if binary:
        return b"event: data\ndata:" + base64.b64encode(payload) + b"\n\n"
    lines = _LINES.split(payload)
    # A parser drops one space after "data:": a line that starts with one keeps it behind another.
    return (
        b"event: data\n"
        + b"".join((b"data: " if line[:1] == b" " else b"data:") + line + b"\n" for line in lines)
        + b"\n"
    )


def control_event(next_pos: int, cursor: str | None, up_to_date: bool, closed: bool) -> bytes:
    control: dict[str, object] = {"streamNextOffset": format_offset(next_pos)}
    if closed:
        control["streamClosed"] = True
        control["upToDate"] = True
    else:
        control["streamCursor"] = cursor
        if up_to_date:
            control["upToDate"] = True
    return b"event: control\ndata:" + _json.encode(control) + b"\n\n"


def frame(event: bytes) -> bytes:
    """`event` as one chunk of a chunked HTTP/1.1 body."""
    return b"%x\r\n%b\r\n" % (len(event), event)
