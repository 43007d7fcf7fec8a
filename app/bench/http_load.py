"""What only the benchmarks need from a raw HTTP client: a Server-Sent Events reader.

`open_event_stream` sends one GET and hands over whole events as they arrive, for the asyncio
subscribers of `rill bench fanout` (httpx's streaming costs too much CPU for hundreds of them).
Responses are parsed by httptools, as in app/cluster/peer_client.py, whose `Connection` the benches
use for their requests.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator

import httptools

from app.cluster.peer_client import dial, encode_request


class EventStream(asyncio.Protocol):
    """One SSE response: `events` yields (event type, data) as they arrive; ends with the response."""

    def __init__(self) -> None:
        self._parser = httptools.HttpResponseParser(self)
        self._status: int | None = None
        self._body = b""  # the part of the body after the last whole event
        self._queue: asyncio.Queue[tuple[bytes, bytes] | None] = asyncio.Queue()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade):
            self._queue.put_nowait(None)
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._queue.put_nowait(None)

    # httptools callbacks

    def on_headers_complete(self) -> None:
        self._status = self._parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        self._body = (self._body + body).replace(b"\r\n", b"\n")  # a CRLF may straddle two pieces
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

    def on_message_complete(self) -> None:
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
    stream = await dial(url, EventStream, tls)
    assert stream.transport is not None
    stream.transport.write(encode_request("GET", url, {"Accept": "text/event-stream"}))
    return stream
