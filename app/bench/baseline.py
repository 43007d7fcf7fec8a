"""The ceiling of the HTTP stack: uvicorn answering every request at once (PUT 201, else 204), no work."""

from __future__ import annotations

from starlette.types import Receive, Scope, Send

_HEADERS = [(b"stream-next-offset", b"0000000000000000_0000000000000000")]


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    if scope["type"] != "http":
        return
    more = True
    while more:
        more = (await receive()).get("more_body", False)
    status = 201 if scope["method"] == "PUT" else 204  # so the workloads' setup sees "created"
    await send({"type": "http.response.start", "status": status, "headers": _HEADERS})
    await send({"type": "http.response.body", "body": b""})
