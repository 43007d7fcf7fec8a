"""The benchmarks' SSE reader (app/bench/http_load.py): whole events out of a chunked response,
however its bytes are split, ending with the response."""

from __future__ import annotations

import asyncio

import pytest

from app.bench.http_load import open_event_stream

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


async def test_events_arrive_whole_and_end_with_the_response() -> None:
    body = b'event: data\r\ndata: [1,\r\ndata: 2]\r\n\r\nevent: control\ndata: {"x":1}\n\n: comment\n\n'
    raw = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
        + b"".join(_chunk(body[i : i + 7]) for i in range(0, len(body), 7))
        + b"0\r\n\r\n"
    )
    requested, finished = asyncio.Event(), asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        requested.set()
        for i in range(0, len(raw), 5):
            writer.write(raw[i : i + 5])
            await writer.drain()
        await reader.read()
        writer.close()
        finished.set()

    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    try:
        stream = await open_event_stream(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/s?live=sse")
        events = [event async for event in stream.events()]
        stream.close()
        await asyncio.wait_for(finished.wait(), 5)
    finally:
        server.close()
    assert requested.is_set() and stream.status == 200
    assert events == [(b"data", b"[1,\n2]"), (b"control", b'{"x":1}')]


async def test_a_server_that_is_not_http_ends_the_events() -> None:
    finished = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"SSH-2.0-nope\r\n\r\n")
        await reader.read()
        writer.close()
        finished.set()

    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    try:
        stream = await open_event_stream(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/s")
        assert [event async for event in stream.events()] == []
        stream.close()
        await asyncio.wait_for(finished.wait(), 5)
    finally:
        server.close()
