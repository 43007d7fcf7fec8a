"""Bytes of request bodies the node holds at once, all requests together."""

from __future__ import annotations

from app.domain.errors import ProtocolError


class BodyBudget:
    """Past the budget a request gets a 503: a flood of large bodies cannot exhaust memory."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.used = 0

    def take(self, size: int) -> int:
        if self.used + size > self.total:
            raise ProtocolError(
                503, "server_busy", "too many request bodies in flight; retry shortly", {"retry-after": "1"}
            )
        self.used += size
        return size

    def give_back(self, size: int) -> None:
        self.used -= size
