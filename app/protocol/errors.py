"""Protocol errors and their JSON rendering: {"error": {"code": ..., "message": ...}}."""

from __future__ import annotations

from collections.abc import Awaitable, Mapping

import msgspec
from starlette.types import Send

from app.protocol.http import Call, Reply, send_reply

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


def error_reply(status: int, code: str, message: str, headers: Mapping[str, str] | None = None) -> Reply:
    return Reply(status, {**(headers or {}), "content-type": "application/json"}, error_body(code, message))


def render_error(exc: ProtocolError) -> Reply:
    return error_reply(exc.status, exc.code, exc.message, exc.headers)


async def answer(call: Call, send: Send, reply: Awaitable[Reply]) -> None:
    """Sends the handler's reply, or the protocol's JSON error for a ProtocolError it raised."""
    try:
        response = await reply
    except ProtocolError as exc:
        response = render_error(exc)
    await send_reply(send, response, head_only=call.method == "HEAD")


def bad_request(message: str, code: str = "bad_request") -> ProtocolError:
    return ProtocolError(400, code, message)
