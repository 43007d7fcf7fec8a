"""Protocol errors and their JSON rendering: {"error": {"code": ..., "message": ...}}."""

from __future__ import annotations

from collections.abc import Mapping

import msgspec
from starlette.responses import Response

_json = msgspec.json.Encoder()


class ProtocolError(Exception):
    def __init__(self, status: int, code: str, message: str, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = dict(headers or {})


def error_response(status: int, code: str, message: str, headers: Mapping[str, str] | None = None) -> Response:
    body = _json.encode({"error": {"code": code, "message": message}})
    return Response(body, status, headers={**(headers or {}), "content-type": "application/json"})


def render_error(exc: ProtocolError) -> Response:
    return error_response(exc.status, exc.code, exc.message, exc.headers)


def bad_request(message: str, code: str = "bad_request") -> ProtocolError:
    return ProtocolError(400, code, message)
