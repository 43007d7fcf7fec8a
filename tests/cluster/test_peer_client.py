"""The client nodes talk to each other with (app/cluster/peer_client.py), against a tiny asyncio server:
Content-Length, chunked and close-delimited bodies, headers in any case, keep-alive, and a peer that
misbehaves (too much, nothing, garbage, a close mid-body) failing the request and closing the connection."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from app.cluster.peer_client import (
    WRITE_SLICE,
    BadResponse,
    Connection,
    ConnectionClosed,
    ResponseTooLarge,
    client_context,
    connect,
    encode_head,
    encode_request,
)

pytestmark = pytest.mark.anyio

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@contextlib.asynccontextmanager
async def _serving(handler: Handler) -> AsyncIterator[str]:
    """A server on a free port running `handler` per connection; yields its URL."""
    tasks: list[asyncio.Task[None]] = []
    writers: list[asyncio.StreamWriter] = []

    async def run(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        tasks.append(task)
        writers.append(writer)
        try:
            await handler(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(run, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/x"
    finally:
        server.close()
        for writer in writers:
            writer.close()  # a handler still reading or writing ends on the closed connection
        if tasks:
            await asyncio.wait(tasks, timeout=5)


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    """One request's body (the client always sends a Content-Length)."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(int(line[15:]) for line in head.lower().split(b"\r\n") if line.startswith(b"content-length:"))
    return await reader.readexactly(length)


def _answering(*responses: bytes, pieces: int = 1) -> Handler:
    """Answers each request with the next of `responses`, written in `pieces` parts with pauses between."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for response in responses:
            await _read_request(reader)
            step = max(1, -(-len(response) // pieces))
            for start in range(0, len(response), step):
                writer.write(response[start : start + step])
                await writer.drain()
                await asyncio.sleep(0.001)
        await reader.read()  # until the client closes

    return handler


async def test_a_content_length_response_with_headers_in_any_case() -> None:
    raw = b"HTTP/1.1 201 Created\r\nCONTENT-length: 5\r\nX-Rill-Thing: a\r\nx-rill-thing: b\r\n\r\nhello"
    async with _serving(_answering(raw, pieces=7)) as url:
        conn = await connect(url)
        response = await conn.request(encode_request("POST", url, {}, b"body"), 5)
        conn.close()
    assert (response.status, response.body) == (201, b"hello")
    assert response.header("x-rill-thing") == response.header("X-RILL-THING") == "a"
    assert response.header("missing") is None
    assert ("x-rill-thing", "b") in response.headers and ("content-length", "5") in response.headers


async def test_a_chunked_response_is_reassembled() -> None:
    raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
    async with _serving(_answering(raw, pieces=len(raw))) as url:  # a byte at a time
        conn = await connect(url)
        response = await conn.request(encode_request("GET", url, {}), 5)
        assert conn.is_open
        conn.close()
    assert (response.status, response.body) == (200, b"hello world")


async def test_one_connection_carries_request_after_request() -> None:
    connections = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        while True:
            body = await _read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))

    async with _serving(handler) as url:
        conn = await connect(url)
        bodies = [(await conn.request(encode_request("POST", url, {}, b"n%d" % i), 5)).body for i in range(20)]
        conn.close()
    assert bodies == [b"n%d" % i for i in range(20)]
    assert connections == 1


async def test_connection_close_ends_the_connection_after_the_response() -> None:
    raw = b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok"
    async with _serving(_answering(raw)) as url:
        conn = await connect(url)
        response = await conn.request(encode_request("GET", url, {}), 5)
        assert response.body == b"ok" and not conn.is_open
        with pytest.raises(ConnectionClosed):
            await conn.request(encode_request("GET", url, {}), 5)


async def test_a_body_without_a_length_ends_when_the_server_closes() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\n\r\nuntil")
        await asyncio.sleep(0.01)
        writer.write(b" the end")

    async with _serving(handler) as url:
        conn = await connect(url)
        response = await conn.request(encode_request("GET", url, {}), 5)
    assert response.body == b"until the end"


async def test_an_interim_response_is_skipped() -> None:
    raw = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n"
    async with _serving(_answering(raw)) as url:
        conn = await connect(url)
        response = await conn.request(encode_request("POST", url, {}, b"x"), 5)
        conn.close()
    assert (response.status, response.body) == (204, b"")


async def test_a_body_declared_over_the_cap_is_refused_before_it_is_read() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000000\r\n\r\n")
        while True:
            writer.write(b"z" * 65536)
            await writer.drain()

    async with _serving(handler) as url:
        conn = await connect(url, max_response=1 << 20)
        with pytest.raises(ResponseTooLarge, match="1000000000"):
            await conn.request(encode_request("GET", url, {}), 5)
        assert not conn.is_open
        assert conn._received < 1 << 20 and not conn._body  # refused at the head


async def test_a_chunked_body_over_the_cap_closes_the_connection() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        while True:  # without end
            writer.write(b"10000\r\n" + b"z" * 65536 + b"\r\n")
            await writer.drain()

    async with _serving(handler) as url:
        conn = await connect(url, max_response=1 << 20)
        with pytest.raises(ResponseTooLarge, match=str(1 << 20)):
            await conn.request(encode_request("GET", url, {}), 5)
        assert not conn.is_open
        assert sum(len(part) for part in conn._body) <= 1 << 20  # nothing past the cap was kept


async def test_a_head_without_end_is_refused() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\n")
        for i in range(100_000):
            writer.write(b"X-Filler-%d: %s\r\n" % (i, b"f" * 100))
            await writer.drain()

    async with _serving(handler) as url:
        conn = await connect(url)
        with pytest.raises(ResponseTooLarge, match="head"):
            await conn.request(encode_request("GET", url, {}), 5)
        assert not conn.is_open


async def test_a_server_that_never_answers_times_out_and_the_connection_closes() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        await asyncio.sleep(0.5)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nlate")  # must not answer the next request
        await reader.read()

    async with _serving(handler) as url:
        conn = await connect(url)
        loop = asyncio.get_running_loop()
        start = loop.time()
        with pytest.raises(TimeoutError):
            await conn.request(encode_request("GET", url, {}), 0.1)
        assert loop.time() - start < 0.4
        assert not conn.is_open
        with pytest.raises(ConnectionClosed):
            await conn.request(encode_request("GET", url, {}), 1)


@pytest.mark.parametrize(("first", "second"), [(0.2, 0.4), (30, 0.2)])
async def test_each_request_gets_its_own_time_on_a_reused_connection(first: float, second: float) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
        await reader.read()  # the second request is never answered

    async with _serving(handler) as url:
        conn = await connect(url)
        await conn.request(encode_request("GET", url, {}), first)
        loop = asyncio.get_running_loop()
        start = loop.time()
        with pytest.raises(TimeoutError):
            await conn.request(encode_request("GET", url, {}), second)
        assert second - 0.02 <= loop.time() - start < second + 0.5


async def test_connecting_times_out() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # takes the connection but never answers the TLS handshake

    async with _serving(handler) as url:
        with pytest.raises(TimeoutError):
            await connect(url.replace("http://", "https://"), client_context(), timeout=0.2)


@pytest.mark.parametrize(
    "raw",
    [
        b"this is not http\r\n\r\n",
        b"HTTP/1.1 abc OK\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: nine\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n",
    ],
)
async def test_garbage_is_a_bad_response(raw: bytes) -> None:
    async with _serving(_answering(raw)) as url:
        conn = await connect(url)
        with pytest.raises(BadResponse):
            await conn.request(encode_request("GET", url, {}), 5)
        assert not conn.is_open


async def test_a_server_closing_mid_body_fails_the_request() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly part")
        await writer.drain()

    async with _serving(handler) as url:
        conn = await connect(url)
        with pytest.raises(ConnectionClosed):
            await conn.request(encode_request("GET", url, {}), 5)


async def test_bytes_after_the_response_close_the_connection_but_the_response_stands() -> None:
    raw = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1 200 OK\r\n"
    async with _serving(_answering(raw)) as url:
        conn = await connect(url)
        response = await conn.request(encode_request("GET", url, {}), 5)
        assert response.body == b"ok"
        assert not conn.is_open


async def test_bytes_while_no_request_waits_close_the_connection() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await asyncio.sleep(0.05)
        writer.write(b"HTTP/1.1 408 Request Timeout\r\nContent-Length: 0\r\n\r\n")  # unasked
        await reader.read()

    async with _serving(handler) as url:
        conn = await connect(url)
        assert (await conn.request(encode_request("GET", url, {}), 5)).body == b"ok"
        await asyncio.sleep(0.2)
        assert not conn.is_open  # the next request will not be answered with the stray 408


async def test_a_large_body_is_handed_to_the_socket_as_it_drains() -> None:
    body = bytearray(b"y" * (16 * WRITE_SLICE))
    received = 0
    done = asyncio.Event()

    async def slow_reader(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal received
        await reader.readuntil(b"\r\n\r\n")
        while received < len(body):
            received += len(await reader.read(256 * 1024))
            await asyncio.sleep(0.005)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        done.set()
        await reader.read()

    async with _serving(slow_reader) as url:
        conn = await connect(url)
        buffered: list[int] = []
        transport = conn._transport
        assert transport is not None

        async def watch() -> None:
            while not done.is_set():
                buffered.append(transport.get_write_buffer_size())
                await asyncio.sleep(0.001)

        watcher = asyncio.ensure_future(watch())
        response = await conn.send_pieces(encode_head("POST", url, {}, len(body)), [memoryview(body)], 30)
        await watcher
        conn.close()
    assert (response.status, response.body, received) == (200, b"ok", len(body))
    assert max(buffered) <= 2 * WRITE_SLICE  # never the whole body in the transport's buffer


async def test_one_request_at_a_time() -> None:
    async with _serving(_answering(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")) as url:
        conn: Connection = await connect(url)
        first = asyncio.ensure_future(conn.request(encode_request("GET", url, {}), 5))
        await asyncio.sleep(0)
        with pytest.raises(RuntimeError):
            await conn.request(encode_request("GET", url, {}), 5)
        assert (await first).status == 200
        conn.close()


def test_client_context_verifies() -> None:
    context = client_context()
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
