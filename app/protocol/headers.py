"""Parsing of protocol request headers and query parameters, each rule in one place."""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta

from app.domain.errors import bad_request
from app.state_machine.commands import Producer

MAX_SAFE_INTEGER = 2**53 - 1

# Bounded lengths: Python refuses to convert very long digit strings, and nothing here needs more.
_DECIMAL = re.compile(r"0|[1-9][0-9]{0,15}")
_DIGITS = re.compile(r"[0-9]{1,16}")
_RFC3339 = re.compile(r"\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-](?:[01]\d|2[0-3]):[0-5]\d)")


def parse_uint(value: str | None) -> int | None:
    """A plain ASCII decimal of at most 16 digits, or None."""
    if value is None or not _DIGITS.fullmatch(value):
        return None
    return int(value)


def parse_ttl(value: str | None) -> int | None:
    if value is None:
        return None
    if not _DECIMAL.fullmatch(value) or int(value) > MAX_SAFE_INTEGER // 1000:
        raise bad_request("Stream-TTL must be a non-negative integer number of seconds", "invalid_ttl")
    return int(value)


def parse_expires_at(value: str | None) -> int | None:
    if value is None:
        return None
    if not _RFC3339.fullmatch(value):
        raise bad_request("Stream-Expires-At must be an RFC 3339 timestamp", "invalid_expires_at")
    try:
        moment = datetime.fromisoformat(value.upper().replace("Z", "+00:00"))
    except ValueError:
        raise bad_request("Stream-Expires-At is not a valid date", "invalid_expires_at") from None
    # Integer arithmetic: timestamp() * 1000 is a float, which lands 1 ms early for some instants.
    ms = (moment - _EPOCH) // _MS
    if not 0 <= ms <= _LATEST_EXPIRY_MS:
        raise bad_request("Stream-Expires-At must be between 1970 and 9999 (UTC)", "invalid_expires_at")
    return ms


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)
_LATEST_EXPIRY_MS = (datetime(9999, 12, 31, 23, 59, 59, 999000, tzinfo=UTC) - _EPOCH) // _MS


def format_expires_at(ms: int) -> str:
    # Exact, unlike fromtimestamp(ms / 1000), whose float rounding reports late instants 1 ms early.
    return (_EPOCH + ms * _MS).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_flag(headers: Mapping[str, str], name: str) -> bool:
    value = headers.get(name)
    if value is None:
        return False
    lowered = value.strip().lower()
    if lowered not in ("true", "false"):
        raise bad_request(f"{name} must be true or false", "invalid_header")
    return lowered == "true"


def parse_producer(headers: Mapping[str, str]) -> Producer | None:
    pid, epoch, seq = headers.get("producer-id"), headers.get("producer-epoch"), headers.get("producer-seq")
    present = [v is not None for v in (pid, epoch, seq)]
    if not any(present):
        return None
    if not all(present):
        raise bad_request("Producer-Id, Producer-Epoch and Producer-Seq go together", "invalid_producer")
    assert pid is not None and epoch is not None and seq is not None
    if not pid or len(pid) > 256:
        raise bad_request("Producer-Id must be a non-empty string of at most 256 characters", "invalid_producer")
    return Producer(pid, _producer_int(epoch, "Producer-Epoch"), _producer_int(seq, "Producer-Seq"))


def _producer_int(value: str, name: str) -> int:
    if not _DIGITS.fullmatch(value) or int(value) > MAX_SAFE_INTEGER:
        raise bad_request(f"{name} must be an integer from 0 to 2^53-1", "invalid_producer")
    return int(value)


def parse_sub_offset(value: str | None) -> int:
    if value is None:
        return 0
    if not _DECIMAL.fullmatch(value) or int(value) > MAX_SAFE_INTEGER:
        raise bad_request("Stream-Fork-Sub-Offset must be a non-negative integer", "invalid_fork_sub_offset")
    return int(value)


def parse_stream_seq(value: str | None) -> str | None:
    if value is not None and (not value or len(value) > 256):
        raise bad_request("Stream-Seq must be 1 to 256 characters", "invalid_stream_seq")
    return value


def single_query(params: Mapping[str, list[str]], name: str) -> str | None:
    """A query parameter that may appear at most once."""
    values = params.get(name, ())
    if len(values) > 1:
        raise bad_request(f"{name} may appear only once", f"invalid_{name}")
    return values[0] if values else None
