"""What one request may cost: body and read sizes, how long live reads last, the URLs handed out."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Limits:
    max_body_bytes: int = 64 * 1024 * 1024
    read_chunk_bytes: int = 1024 * 1024
    long_poll_seconds: float = 20.0
    sse_max_seconds: float = 60.0
    sse_ping_seconds: float = 15.0
    sse_buffer_bytes: int = 1 << 20  # unsent bytes a live subscriber may fall behind by
    snapshot_max_bytes: int = 64 * 1024 * 1024
    bootstrap_max_bytes: int = 8 * 1024 * 1024
    public_url: str | None = None  # this node's URL as clients see it, if configured
    # What the URLs the node hands out start with (Location, callback and JWKS URLs): public_url, else
    # the node's own address (app/service/build.py: base_url). Never a host the request's Host header
    # names, unless it is a cluster member's (app/protocol/http.py: absolute_url).
    base_url: str = "http://127.0.0.1:4437"
    body_budget_bytes: int = 256 * 1024 * 1024  # request bodies held at once, all requests together
