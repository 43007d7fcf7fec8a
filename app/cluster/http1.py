"""Minimal HTTP/1.1 clients on asyncio, for load generation.

httpx tops out around a thousand requests a second on this kind of machine,
far below the servers under test. `Connection` sends pre-encoded requests
over persistent connections and parses only the status line and
Content-Length of each response, so one core can drive tens of thousands of
requests a second; it does not handle chunked responses (appends never get
one). `EventStream` reads one Server-Sent Events response (chunked or not)
and hands over whole events. `https://` URLs get TLS, verified against the
system's CAs or the context given (`client_context(cafile)`).
"""

from __future__ import annotations

import asyncio
import functools
import ssl
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlsplit

P = TypeVar("P", bound=asyncio.Protocol)


class ConnectionClosed(Exception):
    pass


WRITE_SLICE = 1 << 20  # a large body is handed to the socket this much at a time, as it drains


class Connection(asyncio.Protocol):
    def __init__(self) -> None:
        self._buf = bytearray()
        self._waiter: asyncio.Future[tuple[int, bytes]] | None = None
        self._transport: asyncio.Transport | None = None
        self._writable = asyncio.Event()  # cleared while the transport's buffer is above its high-water mark
        self._writable.set()
        self.head = b""  # the last response's status line and headers, lower-cased
        self.raw_head = b""  # the same, as sent

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self._buf += data
        waiter = self._waiter
        if waiter is None or waiter.done():
            return
        end = self._buf.find(b"\r\n\r\n")
        if end < 0:
            return
        raw_head = bytes(self._buf[:end])
        head = raw_head.lower()
        if b"\r\ntransfer-encoding: chunked" in head:
            parsed = _dechunk(self._buf, end + 4)
            if parsed is None:
                return
            body, total = parsed
        else:
            length = int(header(head, b"content-length") or 0)
            total = end + 4 + length
            if len(self._buf) < total:
                return
            body = bytes(self._buf[end + 4 : total])
        del self._buf[:total]
        self.head, self.raw_head = head, raw_head
        waiter.set_result((int(head[9:12]), body))

    def connection_lost(self, exc: Exception | None) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(ConnectionClosed(str(exc)))
        self._writable.set()

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    @property
    def is_open(self) -> bool:
        """False once either side closed it (a server closes idle keep-alive connections)."""
        return self._transport is not None and not self._transport.is_closing()

    async def request(self, raw: bytes, timeout: float | None = None) -> tuple[int, bytes]:
        """Sends one complete request and returns (status, body); TimeoutError past `timeout` seconds."""
        return await self.send_pieces(raw, (), timeout)

    async def send_pieces(
        self, head: bytes, pieces: Sequence[bytes | memoryview], timeout: float | None
    ) -> tuple[int, bytes]:
        """Sends a request whose body is `pieces`, handing the socket a slice at a time as it drains,
        so a large body is never copied whole into the transport's buffer; (status, body) as `request`."""
        transport = self._transport
        if transport is None or transport.is_closing():
            raise ConnectionClosed("the connection is closed")
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        # Not wait_for: that makes a task per request.
        timer = loop.call_later(timeout, self._expire, waiter) if timeout is not None else None
        try:
            transport.write(head)
            for piece in pieces:
                view = memoryview(piece)
                for start in range(0, len(view), WRITE_SLICE):
                    await self._writable.wait()
                    if waiter.done():
                        return await waiter  # the connection was lost or the time is up
                    transport.write(view[start : start + WRITE_SLICE])
            return await waiter
        finally:
            if timer is not None:
                timer.cancel()

    def _expire(self, waiter: asyncio.Future[tuple[int, bytes]]) -> None:
        _expire(waiter)
        self._writable.set()  # a writer waiting for the socket to drain sees the timeout

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()


def _expire(waiter: asyncio.Future[tuple[int, bytes]]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())


def client_context(cafile: Path | str | None = None) -> ssl.SSLContext:
    """A TLS client context that verifies servers against `cafile`, or the system's CAs without one."""
    return ssl.create_default_context(cafile=str(cafile) if cafile is not None else None)


@functools.cache
def _system_context() -> ssl.SSLContext:
    return client_context()


async def _open(url: str, protocol: type[P], tls: ssl.SSLContext | None = None) -> P:
    parts = urlsplit(url)
    host = parts.hostname or "127.0.0.1"
    loop = asyncio.get_running_loop()
    if parts.scheme == "https":
        context = tls or _system_context()
        _, opened = await loop.create_connection(protocol, host, parts.port or 443, ssl=context, server_hostname=host)
    else:
        _, opened = await loop.create_connection(protocol, host, parts.port or 80)
    return opened


async def connect(url: str, tls: ssl.SSLContext | None = None) -> Connection:
    """A keep-alive connection to `url`'s host: TLS (with `tls`, default: the system's CAs) for https://."""
    return await _open(url, Connection, tls)


def _next_chunk(buf: bytearray, pos: int) -> tuple[bytes, int] | None:
    """The chunk at `pos`: (data, position after it), or None until it has all arrived; b"" ends the body."""
    line_end = buf.find(b"\r\n", pos)
    if line_end < 0:
        return None
    size = int(bytes(buf[pos:line_end]).split(b";")[0], 16)
    end = line_end + 2 + size + 2  # no trailers expected after the last chunk
    if len(buf) < end:
        return None
    return bytes(buf[line_end + 2 : line_end + 2 + size]), end


def _dechunk(buf: bytearray, start: int) -> tuple[bytes, int] | None:
    """A complete chunked body from `start`: (body, end position), or None until it has all arrived."""
    parts: list[bytes] = []
    pos = start
    while (chunk := _next_chunk(buf, pos)) is not None:
        data, pos = chunk
        if not data:
            return b"".join(parts), pos
        parts.append(data)
    return None


def header(head: bytes, name: bytes) -> bytes | None:
    """A header's value from a lower-cased response head, or None."""
    marker = head.find(b"\r\n" + name + b":")
    if marker < 0:
        return None
    start = marker + len(name) + 3
    end = head.find(b"\r\n", start)
    return head[start : end if end >= 0 else len(head)].strip()


def parse_headers(raw_head: bytes) -> list[tuple[str, str]]:
    """(name, value) pairs of a response head, names lower-cased."""
    pairs = []
    for line in raw_head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        pairs.append((name.strip().lower().decode("latin-1"), value.strip().decode("latin-1")))
    return pairs


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


class EventStream(asyncio.Protocol):
    """One SSE response: `events` yields (event type, data) as they arrive; ends when the server closes."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._status: int | None = None
        self._chunked = False
        self._body = b""
        self._queue: asyncio.Queue[tuple[bytes, bytes] | None] = asyncio.Queue()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self._buf += data
        if self._status is None:
            end = self._buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self._buf[:end]).lower()
            self._status = int(head[9:12])
            self._chunked = b"transfer-encoding: chunked" in head
            del self._buf[: end + 4]
        body = self._dechunk() if self._chunked else self._take_all()
        self._body += body.replace(b"\r\n", b"\n")
        *blocks, self._body = self._body.split(b"\n\n")
        for block in blocks:
            kind, lines = b"", []
            for line in block.split(b"\n"):
                if line.startswith(b"event:"):
                    kind = line[6:].strip()
                elif line.startswith(b"data:"):
                    lines.append(line[5:].removeprefix(b" "))  # one optional space, as SSE parsers drop
            if lines:
                self._queue.put_nowait((kind, b"\n".join(lines)))

    def _take_all(self) -> bytes:
        data = bytes(self._buf)
        self._buf.clear()
        return data

    def _dechunk(self) -> bytes:
        out = []
        while (chunk := _next_chunk(self._buf, 0)) is not None:
            data, end = chunk
            del self._buf[:end]
            if not data:
                self._queue.put_nowait(None)
                break
            out.append(data)
        return b"".join(out)

    def connection_lost(self, exc: Exception | None) -> None:
        self._queue.put_nowait(None)

    @property
    def status(self) -> int | None:
        return self._status

    async def events(self) -> AsyncIterator[tuple[bytes, bytes]]:
        while (item := await self._queue.get()) is not None:
            yield item

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


async def open_event_stream(url: str, tls: ssl.SSLContext | None = None) -> EventStream:
    """Sends GET `url` (with its query) and returns the stream of events."""
    stream = await _open(url, EventStream, tls)
    assert stream.transport is not None
    stream.transport.write(encode_request("GET", url, {"Accept": "text/event-stream"}))
    return stream
