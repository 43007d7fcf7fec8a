"""Request bodies: bounded reading (413 without buffering past the limit, 503 past the node's
in-flight budget) and JSON-mode flattening, each holding a large body once."""

from __future__ import annotations

import codecs

import msgspec

from app.domain.errors import ProtocolError, bad_request
from app.protocol.headers import parse_uint
from app.protocol.http import Call
from app.service.budget import BodyBudget

_raw = msgspec.json.Decoder(msgspec.Raw)
# Bodies declared this large are read into one buffer instead of joined pieces.
_PREALLOCATE = 64 * 1024
_UTF8_SLICE = 1 << 20
_WHITESPACE = b" \t\r\n"
_STRIP_SLICE = 4096

Body = bytes | bytearray | memoryview


async def read_body(call: Call, limit: int, budget: BodyBudget | None = None) -> bytes:
    body = await read_buffer(call, limit, budget)
    return body if isinstance(body, bytes) else bytes(body)


async def read_buffer(call: Call, limit: int, budget: BodyBudget | None = None) -> bytes | bytearray:
    """The body; a large one with a declared length arrives in one growing buffer, no joins.

    The node's budget is taken as bytes arrive, not for the declared length up front: a client that
    declares a large body and sends it slowly would otherwise hold budget it has not used, and a few
    of them would turn every other write away."""
    declared = parse_uint(call.headers.get("content-length"))
    if declared is not None and declared > limit:
        raise _too_large(limit)
    # Grown in place (a large bytearray is resized by remapping its pages, not copied).
    buffer = bytearray() if declared is not None and declared >= _PREALLOCATE else None
    parts: list[bytes] = []
    size = 0
    while True:
        message = await call.receive()
        if message["type"] == "http.disconnect":
            raise ProtocolError(400, "client_disconnected", "the client went away mid-request")
        part = message.get("body", b"")
        end = size + len(part)
        if end > limit:
            raise _too_large(limit)
        if budget is not None and end > call.held:
            call.held += budget.take(end - call.held)
        if buffer is not None:
            buffer += part
        else:
            parts.append(part)
        size = end
        if not message.get("more_body", False):
            break
    if buffer is not None:
        return buffer
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _too_large(limit: int) -> ProtocolError:
    return ProtocolError(413, "payload_too_large", f"request body exceeds {limit} bytes")


def json_record(body: Body, *, allow_empty: bool) -> Body:
    """Validates a JSON body and flattens one level of array into its messages: the record.

    An array's record is its inside, a view of the body: messages keep their exact bytes and any
    whitespace between them (reads join records with commas inside brackets, still valid JSON with
    the same messages). An empty array is an empty record. Validation decodes the whole document
    as one `msgspec.Raw`, which checks every element but makes no object per message: a list of
    them cost about 70 bytes a message, 37x the body for `[0,0,...]` (issue 26).
    """
    view = memoryview(body)
    lo, hi = _strip(view, 0, len(view))
    view = view[lo:hi]
    _check_utf8(view)
    try:
        _raw.decode(view)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise bad_request(f"invalid JSON: {exc}", "invalid_json") from None
    except RecursionError:
        raise bad_request("invalid JSON: nested too deeply", "invalid_json") from None
    if view[:1] != b"[":
        return view
    lo, hi = _strip(view, 1, len(view) - 1)  # valid JSON: the array closes with the body's last byte
    if lo == hi:
        if not allow_empty:
            raise bad_request("an empty JSON array appends nothing", "empty_json_array")
        return b""
    return view[lo:hi]


def _strip(view: memoryview, lo: int, hi: int) -> tuple[int, int]:
    """[lo, hi) without JSON whitespace at either end; a long run is stripped a slice at a time."""
    while lo < hi and view[lo] in _WHITESPACE:
        piece = bytes(view[lo : min(hi, lo + _STRIP_SLICE)])
        lo += len(piece) - len(piece.lstrip(_WHITESPACE))
    while hi > lo and view[hi - 1] in _WHITESPACE:
        piece = bytes(view[max(lo, hi - _STRIP_SLICE) : hi])
        hi -= len(piece) - len(piece.rstrip(_WHITESPACE))
    return lo, hi


def _check_utf8(view: memoryview) -> None:
    """JSON text is UTF-8 (RFC 8259 8.1); checked a slice at a time so a large body is not copied."""
    try:
        if len(view) <= _UTF8_SLICE:
            str(view, "utf-8")
            return
        decoder = codecs.getincrementaldecoder("utf-8")()
        for start in range(0, len(view), _UTF8_SLICE):
            decoder.decode(view[start : start + _UTF8_SLICE])
        decoder.decode(b"", final=True)
    except UnicodeDecodeError as exc:
        raise bad_request(f"invalid JSON: not UTF-8 at byte {exc.start}", "invalid_json") from None
