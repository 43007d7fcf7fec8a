"""How a lease's token and a subscription's acknowledged positions appear outside the state
machine: the token only by its digest, a position as the protocol's offset (`-1` before any)."""

from __future__ import annotations

import hashlib

from app.domain.offsets import format_offset


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def acked_offset(pos: int) -> str:
    return "-1" if pos < 0 else format_offset(pos)
