"""One request/response cycle: the ASGI `receive` and `send` of a request on an HTTP/1.1 connection.

The semantics are the usual ASGI server's (uvicorn's, which this edge replaced: 100-continue, flow
control, chunked or fixed-length bodies, keep-alive, the error rules of `run_asgi`) with less
per-request work, which at thousands of appends a second costs more than the append itself:
- a response of known length (and one with no body) goes out in one write, head and body;
- header names and values are each checked in one search over all of them (the patterns are
  character classes, so that is the same check);
- no asyncio.Event: `receive` waits on a future only when nothing has arrived yet;
- the body is buffered as the pieces the parser gave, joined once.

Long-lived streaming responses (SSE fan-out) write framed chunks straight to the connection through
`scope["extensions"]["rill.chunks"]`, which is the cycle itself: see `write` and below.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
from collections.abc import Callable
from typing import Any

from app.domain.errors import error_body
from app.domain.headers import SECURITY_HEADERS
from app.serving.flow import HIGH_WATER_LIMIT, FlowControl
from app.serving.headers import check_headers
from app.serving.scope import client_label, path_with_query
from app.serving.status import STATUS_LINE

EXTENSION = "rill.chunks"
TAKE_OVER = "rill.take_over"  # take_over(head, protocol): the connection becomes another protocol's
SWITCHED = "rill.switched"  # set in the scope by a route that took its connection over (an Upgrade)
logger = logging.getLogger("uvicorn.error")
access_logger = logging.getLogger("uvicorn.access")

_DISCONNECT = {"type": "http.disconnect"}


def _nothing() -> None:
    pass


class Cycle:
    __slots__ = (
        "scope", "transport", "flow", "default_headers", "access_log", "on_response",
        "disconnected", "stopping", "_body_done", "keep_alive", "waiting_for_100_continue",
        "_parts", "_size", "more_body", "_pending", "_waiter",
        "response_started", "response_complete", "chunked_encoding", "until_close", "expected_content_length",
        "_head", "status",
    )  # fmt: skip

    def __init__(
        self,
        scope: Any,
        transport: asyncio.Transport,
        flow: FlowControl,
        default_headers: list[tuple[bytes, bytes]],
        keep_alive: bool,
        expect_100_continue: bool = False,
        on_response: Callable[[], None] = _nothing,
        access_log: bool = False,
    ) -> None:
        self.scope = scope
        self.transport = transport
        self.flow = flow
        self.default_headers = default_headers
        self.access_log = access_log
        self.on_response = on_response
        self.disconnected = False
        self.stopping = False  # the server is shutting down: a live read ends as if its client had left
        self._body_done = False  # the app has received the request's last body message
        self.keep_alive = keep_alive
        self.waiting_for_100_continue = expect_100_continue
        # The request body: pieces not yet received by the app, and whether more will come.
        self._parts: list[bytes] = []
        self._size = 0
        self.more_body = True
        self._pending = False  # something for `receive` happened since it last returned
        self._waiter: asyncio.Future[None] | None = None
        self.response_started = False
        self.response_complete = False
        self.chunked_encoding: bool | None = None
        self.until_close = (
            False  # a body of unknown length to HTTP/1.0, which knows no chunks: it ends with the connection
        )
        self.expected_content_length = 0
        self._head: bytes | None = None  # a head held back to go out with the body
        self.status = 0  # the response's, once started (what the request counters read)

    # What the connection tells the cycle

    def body_received(self, body: bytes) -> None:
        self._parts.append(body)
        self._size += len(body)
        if self._size > HIGH_WATER_LIMIT:
            self.flow.pause_reading()
        self.wake()

    def message_complete(self) -> None:
        self.more_body = False
        self.wake()

    def wake(self) -> None:
        """Something `receive` reports happened: body, the request's end, a disconnect, the response's end."""
        self._pending = True
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def stop(self) -> None:
        """The server is shutting down: once the app has the request's whole body, `receive` reports a
        disconnect, so a long-poll answers now and an SSE response ends."""
        self.stopping = True
        self.wake()

    # The app

    async def run_asgi(self, app: Any) -> None:
        try:
            result = await app(self.scope, self.receive, self.send)
        except asyncio.CancelledError:
            self.transport.close()  # the server gave up waiting for this response: not an error of the app's
            raise
        except BaseException as exc:
            logger.error("Exception in ASGI application\n", exc_info=exc)
            if not self.response_started:
                await self.send_500_response()
            else:
                self.transport.close()
        else:
            if result is not None:
                logger.error("ASGI callable should return None, but returned '%s'.", result)
                self.transport.close()
            elif not self.response_started and not self.disconnected:
                logger.error("ASGI callable returned without starting response.")
                await self.send_500_response()
            elif not self.response_complete and not self.disconnected:
                logger.error("ASGI callable returned without completing response.")
                self.transport.close()
        finally:
            self.on_response = _nothing
            # The scope's extensions hold this cycle (and the connection): a reference cycle that only
            # the garbage collector would free, taking every request's objects with it, in pauses.
            extensions = self.scope.get("extensions")
            if extensions:
                extensions.clear()

    async def send_500_response(self) -> None:
        body = error_body("internal_error", "internal server error")
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", b"%d" % len(body)),
            (b"connection", b"close"),
            *SECURITY_HEADERS,
        ]
        await self.send({"type": "http.response.start", "status": 500, "headers": headers})
        await self.send({"type": "http.response.body", "body": body, "more_body": False})

    async def receive(self) -> Any:
        if self.waiting_for_100_continue and not self.transport.is_closing():
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            self.waiting_for_100_continue = False
        if not self._over():
            self.flow.resume_reading()
            if not self._pending:
                waiter = self._waiter = asyncio.get_running_loop().create_future()
                await waiter
            self._pending = False
        if self._over():
            return _DISCONNECT
        parts = self._parts
        body = parts[0] if len(parts) == 1 else b"".join(parts)
        self._parts, self._size = [], 0
        self._body_done = not self.more_body
        return {"type": "http.request", "body": body, "more_body": self.more_body}

    def _over(self) -> bool:
        """Whether `receive` has nothing more to give than a disconnect."""
        return self.disconnected or self.response_complete or (self.stopping and self._body_done)

    async def send(self, message: Any) -> None:
        if self.flow.write_paused and not self.disconnected:
            await self.flow.drain()
        if self.disconnected:
            return
        kind = message["type"]
        if not self.response_started:
            if kind != "http.response.start":
                raise RuntimeError(f"Expected ASGI message 'http.response.start', but got '{kind}'.")
            self._start(message)
            return
        if self.response_complete:
            raise RuntimeError(f"Unexpected ASGI message '{kind}' sent, after response already completed.")
        if kind != "http.response.body":
            raise RuntimeError(f"Expected ASGI message 'http.response.body', but got '{kind}'.")
        body = message.get("body", b"")
        more_body = message.get("more_body", False)
        head, self._head = self._head, None
        if self.scope["method"] == "HEAD":
            self.expected_content_length = 0
            if head is not None:
                self.transport.write(head)
        elif self.chunked_encoding:
            framed = b"%x\r\n%b\r\n" % (len(body), body) if body else b""
            if not more_body:
                framed += b"0\r\n\r\n"
            if framed:
                self.transport.write(framed)
        elif self.until_close:
            if body:
                self.transport.write(body)
        else:
            if len(body) > self.expected_content_length:
                raise RuntimeError("Response content longer than Content-Length")
            self.expected_content_length -= len(body)
            self.transport.write(head + body if head is not None else body)
        if not more_body:
            if self.expected_content_length != 0:
                raise RuntimeError("Response content shorter than Content-Length")
            self.response_complete = True
            self.wake()
            if not self.keep_alive:
                self.transport.close()
            self.on_response()

    def _start(self, message: Any) -> None:
        given = message.get("headers", ())
        # The server's own headers (date, server) are not the app's to get wrong: only the app's are
        # checked, before the response counts as started, so that a bad one is answered with a 500.
        check_headers(given)
        self.response_started = True
        if self.waiting_for_100_continue:
            # The client holds its body back for a 100 that will not come: whatever it sends next
            # could be that body or a request, so the connection ends with this answer.
            self.keep_alive = False
            self.waiting_for_100_continue = False
        status = self.status = message["status"]
        if self.access_log:
            scope = self.scope
            access_logger.info(
                '%s - "%s %s HTTP/%s" %d', client_label(scope), scope["method"],
                path_with_query(scope), scope["http_version"], status,
            )  # fmt: skip
        headers = self.default_headers + list(given)
        content = [STATUS_LINE[status]]
        has_connection_close = False
        for name, value in headers:
            name = name.lower()
            if name == b"content-length" and self.chunked_encoding is None:
                self.expected_content_length = int(value.decode())
                self.chunked_encoding = False
            elif name == b"transfer-encoding" and value.lower() == b"chunked":
                self.expected_content_length = 0
                self.chunked_encoding = True
            elif name == b"connection" and b"close" in [token.lower().strip() for token in value.split(b",")]:
                self.keep_alive = False
                has_connection_close = True
            content.extend((name, b": ", value, b"\r\n"))
        if not self.keep_alive and not has_connection_close:
            content.append(b"connection: close\r\n")
        no_body = self.scope["method"] == "HEAD" or status in (204, 304)
        if self.chunked_encoding is None and not no_body:
            if self.scope["http_version"] == "1.0":  # never kept alive (connection.py): the close ends it
                self.chunked_encoding, self.until_close = False, True
            else:
                self.chunked_encoding = True
                content.append(b"transfer-encoding: chunked\r\n")
        content.append(b"\r\n")
        if self.chunked_encoding or self.until_close:
            self.transport.write(b"".join(content))  # a streaming body: its head goes out now
        else:
            self._head = b"".join(content)

    # Direct writes (the `rill.chunks` extension)

    @property
    def ready(self) -> bool:
        """Whether a chunked response has started and the body may be written directly."""
        return self.response_started and not self.response_complete and bool(self.chunked_encoding)

    def offer(self, framed: bytes, limit: int) -> bool:
        """Writes bytes already framed as a chunk (`len-in-hex CRLF data CRLF`); False if the connection
        is gone, or holds more than `limit` bytes the socket has not taken (then it is aborted)."""
        transport = self.transport
        if self.disconnected or transport.is_closing():
            return False
        if transport.get_write_buffer_size() > limit:
            self.abort()
            return False
        transport.write(framed)
        return True

    def abort(self) -> None:
        """Drops the connection and what is buffered for it: the client reconnects from its offset."""
        transport = self.transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):  # a reset, so the kernel drops its send buffer too
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        transport.abort()
