"""The ASGI wrapper that counts every HTTP request by route family, method and status.

Live reads (`live=sse`, `live=long-poll`) are counted as requests when they end, and as live
readers while they last; their duration is the subscription's, so it stays out of the latency
histogram.
"""

from __future__ import annotations

import time
from urllib.parse import parse_qsl

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.counters.counts import RequestCounters
from app.domain.paths import BUCKET_LIST, COMPAT_PREFIX, INTERNAL_PREFIX, LEGACY_PREFIX, RAFT_PATH
from app.serving.cycle import EXTENSION, SWITCHED, Cycle

_METHODS = frozenset(("GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH"))
_FAMILIES = (
    (BUCKET_LIST, "ds"), (LEGACY_PREFIX, "legacy"), (COMPAT_PREFIX, "compat"), (RAFT_PATH, "raft"),
    (INTERNAL_PREFIX, "cluster"),
)  # fmt: skip


def family_of(path: str) -> str:
    for prefix, family in _FAMILIES:
        if path.startswith(prefix):
            return family
    return "other"


def live_mode(query: bytes) -> str | None:
    if b"live=" not in query:  # the common case, without parsing
        return None
    # Decoded as the server reads it (`live=long%2Dpoll` is a long-poll too).
    modes = {"sse": "sse", "long-poll": "long_poll"}
    return next((modes[v] for k, v in parse_qsl(query.decode("latin-1")) if k == "live" and v in modes), None)


class _Status:
    """The status a response started with, under a server other than Rill's edge."""

    status = 0

    def watching(self, send: Send) -> Send:
        async def sender(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.status = message["status"]
            await send(message)

        return sender


def count_requests(app: ASGIApp, counters: RequestCounters) -> ASGIApp:
    async def counted(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        started = time.perf_counter()
        # Rill's edge records the status itself (one wrapper less per send on every request).
        cycle = scope.get("extensions", {}).get(EXTENSION)
        seen: Cycle | _Status
        if isinstance(cycle, Cycle):
            seen = cycle
        else:
            seen = _Status()
            send = seen.watching(send)
        mode = live_mode(scope["query_string"]) if scope["method"] == "GET" else None
        if mode is not None:
            counters.live[mode] += 1
        failed = False
        try:
            await app(scope, receive, send)
        except Exception:
            failed = True  # the server answers 500 once this returns, if nothing was sent yet
            raise
        finally:
            if mode is not None:
                counters.live[mode] -= 1
            method = scope["method"] if scope["method"] in _METHODS else "other"
            elapsed = None if mode is not None else time.perf_counter() - started
            # 0: the connection ended before any response began; 101: the app took the connection over.
            status = seen.status
            if status == 0 and scope.get(SWITCHED):
                status = 101
            elif status == 0 and failed:
                status = 500
            counters.finished(family_of(scope["path"]), method, status, elapsed)

    return counted
