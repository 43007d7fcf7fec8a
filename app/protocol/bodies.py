"""Request bodies: bounded reading (413 without buffering past the limit) and JSON-mode flattening."""

from __future__ import annotations

import msgspec

from app.domain.errors import ProtocolError, bad_request
from app.protocol.headers import parse_uint
from app.protocol.http import Call

_raw = msgspec.json.Decoder(msgspec.Raw)
_raw_list = msgspec.json.Decoder(list[msgspec.Raw])


async def read_body(call: Call, limit: int) -> bytes:
    declared = parse_uint(call.headers.get("content-length"))
    if declared is not None and declared > limit:
        raise _too_large(limit)
    parts: list[bytes] = []
    size = 0
    while True:
        message = await call.receive()
        if message["type"] == "http.disconnect":
            raise ProtocolError(400, "client_disconnected", "the client went away mid-request")
        part = message.get("body", b"")
        size += len(part)
        if size > limit:
            raise _too_large(limit)
        parts.append(part)
        if not message.get("more_body", False):
            break
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _too_large(limit: int) -> ProtocolError:
    return ProtocolError(413, "payload_too_large", f"request body exceeds {limit} bytes")


def json_record(body: bytes, *, allow_empty: bool) -> bytes:
    """Validates a JSON body and flattens one level of array into messages joined by commas.

    Messages keep their exact bytes; an empty array is an empty record.
    """
    try:
        stripped = body.strip()
        messages = _raw_list.decode(stripped) if stripped.startswith(b"[") else [_raw.decode(stripped)]
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise bad_request(f"invalid JSON: {exc}", "invalid_json") from None
    except RecursionError:
        raise bad_request("invalid JSON: nested too deeply", "invalid_json") from None
    if not messages and not allow_empty:
        raise bad_request("an empty JSON array appends nothing", "empty_json_array")
    return b",".join(bytes(m) for m in messages)
