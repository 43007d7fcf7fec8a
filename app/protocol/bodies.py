"""Request bodies: bounded reading (413 without buffering past the limit) and JSON-mode flattening."""

from __future__ import annotations

import msgspec
from starlette.requests import Request

from app.protocol.errors import ProtocolError, bad_request

_raw = msgspec.json.Decoder(msgspec.Raw)
_raw_list = msgspec.json.Decoder(list[msgspec.Raw])


async def read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    parts: list[bytes] = []
    size = 0
    async for part in request.stream():
        size += len(part)
        if size > limit:
            raise _too_large(limit)
        parts.append(part)
    return b"".join(parts)


def _too_large(limit: int) -> ProtocolError:
    return ProtocolError(413, "payload_too_large", f"request body exceeds {limit} bytes")


def json_record(body: bytes, *, allow_empty: bool) -> bytes:
    """Validates a JSON body and flattens one level of array into messages joined by commas.

    Messages keep their exact bytes; an empty array is an empty record.
    """
    try:
        stripped = body.strip()
        if stripped.startswith(b"["):
            messages = _raw_list.decode(stripped)
        else:
            messages = [_raw.decode(stripped)]
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise bad_request(f"invalid JSON: {exc}", "invalid_json") from None
    if not messages and not allow_empty:
        raise bad_request("an empty JSON array appends nothing", "empty_json_array")
    return b",".join(bytes(m) for m in messages)
