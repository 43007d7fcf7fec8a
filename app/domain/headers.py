"""Browser security headers the protocol recommends on every response, from the app and from the
HTTP edge alike."""

from __future__ import annotations

# nosniff: a stream's bytes are never taken for another type; cross-origin: browsers may read them from any page.
SECURITY_HEADERS: list[tuple[bytes, bytes]] = [
    (b"x-content-type-options", b"nosniff"),
    (b"cross-origin-resource-policy", b"cross-origin"),
]
