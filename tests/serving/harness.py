"""The edge protocol driven in-process: a fake transport, the uvicorn Config and ServerState it is built
with, and small ASGI apps. What a real socket cannot easily show, deterministically and fast."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from uvicorn.config import Config
from uvicorn.server import ServerState

from app.serving.connection import EdgeProtocol, protocol_for
from app.serving.limits import EdgeLimits

App = Callable[[Any, Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]]
GET = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"


class FakeTransport(asyncio.Transport):
    def __init__(self, extra: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.written = bytearray()
        self.writes = 0
        self.closed = self.eof = self.paused = False
        self.extra = {"peername": ("127.0.0.1", 50000), "sockname": ("127.0.0.1", 4437), **(extra or {})}

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += data
        self.writes += 1

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.eof = True

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def get_write_buffer_size(self) -> int:
        return 0

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.extra.get(name, default)


async def ok(scope: Any, receive: Any, send: Any) -> None:
    """Reads the whole body, answers 200 `ok`."""
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


class Recorder:
    """An app answering 200 with the request body, recording each request's scope and body."""

    def __init__(self) -> None:
        self.requests: list[tuple[Any, bytes]] = []
        self.extensions: list[dict[str, Any]] = []  # as each request saw them (the edge clears them after)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        self.requests.append((scope, body))
        self.extensions.append(dict(scope.get("extensions") or {}))
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(body))]})
        await send({"type": "http.response.body", "body": body})


def connect(
    app: App,
    limits: EdgeLimits | None = None,
    *,
    loop: Any = None,
    state: ServerState | None = None,
    app_state: dict[str, Any] | None = None,
    transport: FakeTransport | None = None,
    root_path: str = "",
) -> tuple[EdgeProtocol, FakeTransport]:
    """A connection made, as uvicorn makes one: call inside a running loop."""
    protocol = EdgeProtocol if limits is None else protocol_for(limits)
    config = Config(
        app=app, http=protocol, ws="none", lifespan="off", log_config=None, proxy_headers=False, root_path=root_path
    )
    config.load()
    connection = protocol(
        config=config,
        server_state=state or ServerState(),
        app_state={} if app_state is None else app_state,
        _loop=loop or asyncio.get_running_loop(),
    )
    transport = transport or FakeTransport()
    connection.connection_made(transport)
    return connection, transport


async def settle() -> None:
    """A few loop turns: the app's task runs as far as it can."""
    for _ in range(10):
        await asyncio.sleep(0)


def statuses(written: bytes | bytearray) -> list[int]:
    """The status codes of the responses in `written`, in order (bodies must not contain `HTTP/1.1 `)."""
    return [int(part[:3]) for part in bytes(written).split(b"HTTP/1.1 ")[1:]]
