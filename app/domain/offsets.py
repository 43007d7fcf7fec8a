"""Offset tokens: fixed-width `RRRRRRRRRRRRRRRR_PPPPPPPPPPPPPPPP`, lexicographically ordered.

The second part is the byte position in the stream's record space; the first
is reserved (always zero) so the format can grow without breaking order.
"""

from __future__ import annotations

import re

from app.domain.errors import bad_request

START = -1
_TOKEN = re.compile(r"0{16}_[0-9]{16}")  # not \d: that takes any Unicode digit


def format_offset(pos: int) -> str:
    return f"0000000000000000_{pos:016d}"


def parse_offset(token: str, tail: int) -> int:
    """The position a client's `offset` means: `-1` is the start, `now` the tail."""
    if token == "-1":
        return 0
    if token == "now":
        return tail
    if not _TOKEN.fullmatch(token):
        raise bad_request("offset must be -1, now, or an offset the server issued", "invalid_offset")
    return int(token[17:])


def parse_position(token: str) -> int:
    """A concrete offset (no sentinels), as in Stream-Fork-Offset."""
    if not _TOKEN.fullmatch(token):
        raise bad_request("malformed offset", "invalid_offset")
    return int(token[17:])


def acked_offset(pos: int) -> str:
    """A subscription's acknowledged position as an offset: `-1` before anything was acknowledged."""
    return "-1" if pos < 0 else format_offset(pos)
