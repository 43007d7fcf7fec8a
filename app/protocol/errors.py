"""Protocol errors rendered as replies: {"error": {"code": ..., "message": ...}}."""

from __future__ import annotations

from collections.abc import Awaitable, Mapping

from starlette.types import Send

from app.domain.errors import ProtocolError, error_body
from app.protocol.http import Call, Reply, send_reply


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
