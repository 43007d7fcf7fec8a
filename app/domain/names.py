"""What makes a stream id acceptable, wherever one comes from: a request, or an object in the store."""

from __future__ import annotations

import re

MAX_STREAM_ID_BYTES = 1024
BUCKET_ID = re.compile(r"[a-z0-9_-]{4,64}")  # the buckets clients create (the built-in ones have dots)
# C0, DEL and C1: an id holding one could forge lines in logs and break tools that print ids.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def stream_id_problem(name: str) -> str | None:
    """Why `name` cannot be a stream id, or None when it can (the rules every route family shares)."""
    if not name:
        return "stream id is empty"
    try:
        encoded = name.encode()
    except UnicodeEncodeError:  # a lone surrogate, from a JSON document's escapes
        return "stream id is not valid UTF-8"
    if len(encoded) > MAX_STREAM_ID_BYTES:
        return "stream id is longer than 1 KiB"
    control = _CONTROL.search(name)
    if control is not None:
        return f"stream id contains control character U+{ord(control[0]):04X}"
    if any(seg in ("", ".", "..") for seg in name.split("/")):
        return "stream id has an empty, '.' or '..' segment"
    return None
