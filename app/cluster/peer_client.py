"""The HTTP/1.1 client nodes use to talk to each other: Raft batches (app/cluster/transport.py) and
writes a follower forwards to its leader (app/routes/forward.py); the benchmarks drive servers with it.

httpx costs about a millisecond of CPU per request, which a node sending every Raft round and
forwarding every write cannot spare. A `Connection` sends pre-encoded requests over one keep-alive
connection, one at a time, and parses responses with httptools (llhttp, the parser uvicorn serves
with): status line, headers, Content-Length, chunked or close-delimited bodies, keep-alive. A peer is
not trusted to behave: each response is capped (head and body, `MAX_RESPONSE_BYTES` unless the
connection was given another cap), connecting and each response have a time limit, and whatever goes
wrong closes the connection and raises a `PeerClientError` (or `TimeoutError`), so a broken or hostile
peer can neither make this node buffer without end nor hand a stale response to the next request.
`https://` URLs get TLS, verified against the system's CAs or the context given (`client_context`).
"""

from __future__ import annotations

import asyncio
import functools
import ssl
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlsplit

import httptools

P = TypeVar("P", bound=asyncio.BaseProtocol)

WRITE_SLICE = 1 << 20  # a large body is handed to the socket this much at a time, as it drains
MAX_RESPONSE_BYTES = 64 * 1024 * 1024  # a response's bytes on the wire, head and body
MAX_HEAD_BYTES = 64 * 1024  # a status line and headers past this are not a peer's
CONNECT_SECONDS = 5.0
RESPONSE_SECONDS = 30.0


class PeerClientError(Exception):
    """A request failed; its connection is closed."""


class ConnectionClosed(PeerClientError):
    """The connection closed before the response was complete."""


class BadResponse(PeerClientError):
    """The server did not answer in HTTP/1.1, or answered what was not asked."""


class ResponseTooLarge(PeerClientError):
    """The response's head or body went past the connection's cap."""


class Response:
    """A status, the headers as sent (names kept as bytes until asked for) and the whole body."""

    __slots__ = ("status", "body", "raw_headers")

    def __init__(self, status: int, raw_headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        self.status = status
        self.raw_headers = raw_headers
        self.body = body

    @property
    def headers(self) -> list[tuple[str, str]]:
        """(name, value) pairs in order, names lower-cased."""
        return [(name.decode("latin-1").lower(), value.decode("latin-1")) for name, value in self.raw_headers]

    def header(self, name: str) -> str | None:
        """The first value of header `name` (any case), or None."""
        wanted = name.lower().encode("latin-1")
        for key, value in self.raw_headers:
            if key.lower() == wanted:
                return value.decode("latin-1")
        return None


class Connection(asyncio.Protocol):
    """One keep-alive connection: `request` or `send_pieces`, one at a time."""

    def __init__(self, max_response: int = MAX_RESPONSE_BYTES) -> None:
        self.max_response = max_response
        self._parser = httptools.HttpResponseParser(self)
        self._transport: asyncio.Transport | None = None
        self._waiter: asyncio.Future[Response] | None = None
        self._writable = asyncio.Event()  # cleared while the transport's buffer is above its high-water mark
        self._writable.set()
        self._received = 0  # bytes of the response in progress
        self._headers: list[tuple[bytes, bytes]] = []
        self._body: list[bytes] = []
        self._head_done = False
        self._until_close = False  # the body has no length: it ends when the server closes
        self._failure: PeerClientError | None = None  # raised by a parser callback, which httptools wraps
        self._deadline: float | None = None  # when the request in flight times out (loop time)
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0  # the deadline the timer was set for

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        waiter = self._waiter
        if waiter is None or waiter.done():
            # Nothing is asked for (or it timed out): whatever comes now cannot be matched to a request.
            self._fail(BadResponse("the server sent data with no request waiting"))
            return
        if not self._head_done and self._received > MAX_HEAD_BYTES:
            self._fail(ResponseTooLarge(f"a response's head is over {MAX_HEAD_BYTES} bytes"))
            return
        self._received += len(data)
        if self._received > self.max_response:
            self._fail(ResponseTooLarge(f"the response is over {self.max_response} bytes"))
            return
        try:
            self._parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
            self._fail(self._failure or BadResponse(f"not an HTTP/1.1 response: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        if self._until_close and exc is None and self._failure is None:
            self.on_message_complete()  # a body without a length ends as the server closes, cleanly
        self._fail(ConnectionClosed(f"the server closed the connection{f': {exc}' if exc else ''}"))
        self._writable.set()

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    # httptools callbacks

    def on_message_begin(self) -> None:
        if self._waiter is None:  # more bytes after the response: the stream is out of step
            self._failure = BadResponse("the server sent more than the response")
            raise self._failure

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        self._head_done = True
        length, chunked = None, False
        for name, value in self._headers:
            key = name.lower()
            if key == b"content-length":
                length = int(value)  # llhttp has checked it is a number
            elif key == b"transfer-encoding":
                chunked = value.lower().endswith(b"chunked")
        if length is not None and length > self.max_response:  # refused before any of it is read
            self._failure = ResponseTooLarge(f"the response's body ({length} bytes) is over {self.max_response}")
            raise self._failure
        status = self._parser.get_status_code()
        self._until_close = length is None and not chunked and status >= 200 and status not in (204, 304)

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        status = self._parser.get_status_code()
        headers, body = self._headers, b"".join(self._body)
        self._headers, self._body, self._head_done, self._until_close = [], [], False, False
        if status < 200:
            return  # an interim response (100 Continue): the real one follows
        waiter = self._waiter
        self._waiter = None
        if waiter is not None and not waiter.done():
            waiter.set_result(Response(status, headers, body))
        if not self._parser.should_keep_alive() and self._transport is not None:
            self._transport.close()  # `Connection: close` (or HTTP/1.0): not for another request

    # requests

    @property
    def is_open(self) -> bool:
        """False once either side closed it (a server closes idle keep-alive connections)."""
        return self._transport is not None and not self._transport.is_closing()

    async def request(self, raw: bytes, timeout: float | None = RESPONSE_SECONDS) -> Response:
        """Sends one complete request and returns the response; TimeoutError past `timeout` seconds."""
        return await self.send_pieces(raw, (), timeout)

    async def send_pieces(
        self, head: bytes, pieces: Sequence[bytes | memoryview], timeout: float | None = RESPONSE_SECONDS
    ) -> Response:
        """Sends a request whose body is `pieces`, handing the socket a slice at a time as it drains,
        so a large body is never copied whole into the transport's buffer; the response as `request`."""
        transport = self._transport
        if transport is None or transport.is_closing():
            raise ConnectionClosed("the connection is closed")
        if self._waiter is not None:
            raise RuntimeError("one request at a time on a connection")
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        self._received = 0
        self._set_deadline(loop, timeout)
        try:
            transport.write(head)
            for piece in pieces:
                view = memoryview(piece)
                for start in range(0, len(view), WRITE_SLICE):
                    await self._writable.wait()
                    if waiter.done():
                        return await waiter  # the connection failed or the time is up
                    transport.write(view[start : start + WRITE_SLICE])
            return await waiter
        finally:
            if self._waiter is waiter:
                self._waiter = None

    def _set_deadline(self, loop: asyncio.AbstractEventLoop, timeout: float | None) -> None:
        # Not wait_for (a task per request), nor a timer per request (call_later and cancel cost
        # a third of a request's CPU here): one timer per connection, set again only when it fires
        # while a later deadline is pending, or when a deadline comes before it.
        if timeout is None:
            self._deadline = None
            return
        deadline = self._deadline = loop.time() + timeout
        if self._timer is None or deadline < self._timer_at:
            if self._timer is not None:
                self._timer.cancel()
            self._timer, self._timer_at = loop.call_at(deadline, self._on_timer), deadline

    def _on_timer(self) -> None:
        self._timer = None
        waiter, deadline = self._waiter, self._deadline
        if waiter is None or waiter.done() or deadline is None:
            return  # idle: the next request sets the timer again
        if deadline > self._timer_at:  # the request in flight came after the one the timer was set for
            self._timer, self._timer_at = asyncio.get_running_loop().call_at(deadline, self._on_timer), deadline
            return
        waiter.set_exception(TimeoutError("no response in time"))
        self.close()  # a late answer must not be taken for the next request's
        self._writable.set()  # a writer waiting for the socket to drain sees the timeout

    def _fail(self, exc: PeerClientError) -> None:
        """Closes the connection; the request waiting, if any, raises `exc`."""
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)
        self.close()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._transport is not None:
            self._transport.close()


def client_context(cafile: Path | str | None = None) -> ssl.SSLContext:
    """A TLS client context that verifies servers against `cafile`, or the system's CAs without one."""
    return ssl.create_default_context(cafile=str(cafile) if cafile is not None else None)


@functools.cache
def _system_context() -> ssl.SSLContext:
    return client_context()


async def dial(
    url: str, protocol: Callable[[], P], tls: ssl.SSLContext | None = None, timeout: float = CONNECT_SECONDS
) -> P:
    """`protocol` connected to `url`'s host (TLS for https://), within `timeout` seconds or TimeoutError."""
    parts = urlsplit(url)
    host = parts.hostname or "127.0.0.1"
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(timeout):
        if parts.scheme == "https":
            context = tls or _system_context()
            _, opened = await loop.create_connection(
                protocol, host, parts.port or 443, ssl=context, server_hostname=host
            )
        else:
            _, opened = await loop.create_connection(protocol, host, parts.port or 80)
    return opened


async def connect(
    url: str,
    tls: ssl.SSLContext | None = None,
    timeout: float = CONNECT_SECONDS,
    max_response: int = MAX_RESPONSE_BYTES,
) -> Connection:
    """A keep-alive connection to `url`'s host: TLS (with `tls`, default: the system's CAs) for https://."""
    return await dial(url, functools.partial(Connection, max_response), tls, timeout)


def encode_request(method: str, url: str, headers: dict[str, str], body: bytes = b"", host: str | None = None) -> bytes:
    """`host` overrides the Host header (a forwarded request keeps the one its client sent)."""
    return encode_head(method, url, headers, len(body), host) + body


def encode_head(method: str, url: str, headers: dict[str, str], length: int, host: str | None = None) -> bytes:
    """A request's line and headers, for a body of `length` bytes sent after them."""
    parts = urlsplit(url)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host or parts.netloc}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    lines.append(f"Content-Length: {length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()
