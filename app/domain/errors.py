"""The error a request can fail with, as a status, a stable code and a message.

It lives below every layer so the node, tiering and the protocol raise the same thing; the
protocol core renders it as {"error": {"code": ..., "message": ...}}.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

_json = msgspec.json.Encoder()


class LeaderOnly(Exception):
    """This request must be served by the leader (the route answers with a redirect to it)."""


class ProtocolError(Exception):
    def __init__(self, status: int, code: str, message: str, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = dict(headers or {})


def error_body(code: str, message: str) -> bytes:
    return _json.encode({"error": {"code": code, "message": message}})


def bad_request(message: str, code: str = "bad_request") -> ProtocolError:
    return ProtocolError(400, code, message)


def missing_bucket(bucket: str) -> ProtocolError:
    return ProtocolError(404, "bucket_not_found", f"bucket {bucket!r} does not exist")


def missing_stream() -> ProtocolError:
    return ProtocolError(404, "stream_not_found", "stream not found")
