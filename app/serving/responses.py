"""The edge's own answers, written straight to the transport: the same JSON error shape and
security headers as the app's."""

from __future__ import annotations

from app.domain.errors import error_body
from app.domain.headers import SECURITY_HEADERS
from app.serving.status import STATUS_LINE

_SECURITY = b"".join(name + b": " + value + b"\r\n" for name, value in SECURITY_HEADERS)


def error_response(
    status: int,
    code: str,
    message: str,
    default_headers: list[tuple[bytes, bytes]],
    retry_after: int | None = None,
) -> bytes:
    """A complete `Connection: close` response carrying {"error": {"code", "message"}}."""
    body = error_body(code, message)
    parts = [STATUS_LINE[status]]
    for name, value in default_headers:
        parts += [name, b": ", value, b"\r\n"]
    parts.append(b"content-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n" % len(body))
    parts.append(_SECURITY)
    if retry_after is not None:
        parts.append(b"retry-after: %d\r\n" % retry_after)
    parts += [b"\r\n", body]
    return b"".join(parts)
