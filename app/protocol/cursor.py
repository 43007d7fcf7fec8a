"""Stream-Cursor: time-interval numbers that never go backwards for a client (CDN collapsing)."""

from __future__ import annotations

import random

from app.protocol.headers import parse_uint

EPOCH_MS = 1728432000000  # 2024-10-09T00:00:00Z
INTERVAL_MS = 20_000


def next_cursor(now_ms: int, client_cursor: str | None) -> str:
    current = (now_ms - EPOCH_MS) // INTERVAL_MS
    client = parse_uint(client_cursor)
    if client is not None and client >= current:
        # Jitter of 1..3600 s, in intervals, so cached responses cannot cycle.
        return str(client + max(1, -(-random.randint(1, 3600) // (INTERVAL_MS // 1000))))
    return str(current)
