"""The response's start: what an ASGI server writes, in one write with the body when the length is known."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from app.serving.cycle import Cycle
from app.serving.flow import HIGH_WATER_LIMIT

pytestmark = pytest.mark.anyio


class FakeTransport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        if data:
            self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_write_buffer_size(self) -> int:
        return 0


class FakeFlow:
    write_paused = False

    async def drain(self) -> None:  # pragma: no cover - never paused here
        pass


def cycle(method: str = "POST", keep_alive: bool = True) -> tuple[Cycle, FakeTransport]:
    transport = FakeTransport()
    scope: Any = {"type": "http", "method": method, "http_version": "1.1", "path": "/"}
    c = Cycle(scope, transport, FakeFlow(), [(b"server", b"rill")], keep_alive)  # type: ignore[arg-type]
    return c, transport


async def test_a_response_of_known_length_goes_out_in_one_write() -> None:
    c, transport = cycle()
    await c.send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"5")]})
    assert transport.writes == []
    await c.send({"type": "http.response.body", "body": b"hello"})
    assert transport.writes == [b"HTTP/1.1 200 OK\r\nserver: rill\r\ncontent-length: 5\r\n\r\nhello"]
    assert c.response_complete


async def test_a_204_and_a_head_write_the_head_alone() -> None:
    c, transport = cycle()
    await c.send({"type": "http.response.start", "status": 204, "headers": [(b"stream-next-offset", b"1")]})
    await c.send({"type": "http.response.body", "body": b""})
    assert transport.writes == [b"HTTP/1.1 204 No Content\r\nserver: rill\r\nstream-next-offset: 1\r\n\r\n"]
    c, transport = cycle("HEAD")
    await c.send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"5")]})
    await c.send({"type": "http.response.body", "body": b"hello"})
    assert transport.writes == [b"HTTP/1.1 200 OK\r\nserver: rill\r\ncontent-length: 5\r\n\r\n"]
    assert c.response_complete


async def test_a_streaming_response_writes_its_head_at_once_and_is_chunked() -> None:
    c, transport = cycle("GET")
    await c.send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
    assert transport.writes == [
        b"HTTP/1.1 200 OK\r\nserver: rill\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    ]
    await c.send({"type": "http.response.body", "body": b"abc", "more_body": True})
    await c.send({"type": "http.response.body", "body": b"", "more_body": False})
    assert transport.writes[1:] == [b"3\r\nabc\r\n", b"0\r\n\r\n"]


async def test_connection_close_is_added_when_not_kept_alive() -> None:
    c, transport = cycle(keep_alive=False)
    await c.send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"0")]})
    await c.send({"type": "http.response.body", "body": b""})
    assert transport.writes == [b"HTTP/1.1 200 OK\r\nserver: rill\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"]
    assert transport.closed


@pytest.mark.parametrize(
    "headers",
    [[(b"bad name", b"x")], [(b"x-ok", b"line\r\nbreak")], [(b"x-ok", b"nul\x00")]],
)
async def test_invalid_header_names_and_values_are_refused(headers: list[tuple[bytes, bytes]]) -> None:
    c, transport = cycle()
    with pytest.raises(RuntimeError):
        await c.send({"type": "http.response.start", "status": 200, "headers": headers})
    assert transport.writes == []


class ReadingFlow(FakeFlow):
    def __init__(self) -> None:
        self.resumed = 0
        self.paused = 0

    def resume_reading(self) -> None:
        self.resumed += 1

    def pause_reading(self) -> None:
        self.paused += 1


async def test_receive_waits_for_the_body_and_joins_its_pieces_once() -> None:
    flow = ReadingFlow()
    c = Cycle({"type": "http", "method": "POST"}, FakeTransport(), flow, [], True)  # type: ignore[arg-type]
    waiting = asyncio.ensure_future(c.receive())
    await asyncio.sleep(0)
    assert not waiting.done() and flow.resumed == 1  # nothing yet: it asked for the body and waits
    c.body_received(b"ab")
    c.body_received(b"cd")
    assert await waiting == {"type": "http.request", "body": b"abcd", "more_body": True}
    c.body_received(b"e")
    c.message_complete()
    assert await c.receive() == {"type": "http.request", "body": b"e", "more_body": False}
    # After the whole body, receive waits for the end of the response (or a disconnect).
    waiting = asyncio.ensure_future(c.receive())
    await asyncio.sleep(0)
    assert not waiting.done()
    await c.send({"type": "http.response.start", "status": 204})
    await c.send({"type": "http.response.body", "body": b""})
    assert await waiting == {"type": "http.disconnect"}


async def test_a_body_past_the_high_water_mark_pauses_reading_and_a_disconnect_wakes_receive() -> None:
    flow = ReadingFlow()
    c = Cycle({"type": "http", "method": "POST"}, FakeTransport(), flow, [], True)  # type: ignore[arg-type]
    c.body_received(b"x" * (HIGH_WATER_LIMIT + 1))
    assert flow.paused == 1
    assert (await c.receive())["body"] == b"x" * (HIGH_WATER_LIMIT + 1)
    waiting = asyncio.ensure_future(c.receive())
    await asyncio.sleep(0)
    c.disconnected = True
    c.wake()
    assert await waiting == {"type": "http.disconnect"}


async def test_100_continue_is_sent_when_the_app_first_reads() -> None:
    transport = FakeTransport()
    c = Cycle({"type": "http", "method": "POST"}, transport, ReadingFlow(), [], True, expect_100_continue=True)  # type: ignore[arg-type]
    c.message_complete()
    await c.receive()
    assert transport.writes == [b"HTTP/1.1 100 Continue\r\n\r\n"]
