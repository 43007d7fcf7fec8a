"""The edge protocol driven in-process over a fake transport: what a real socket cannot easily show
(the app's 500 fallback, flow-control pauses, timer work per request)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from app.serving.limits import EdgeLimits
from tests.serving.harness import GET, connect, ok, settle


class CountingLoop:
    """The running loop, counting the timers the protocol schedules."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.timers = 0

    def call_at(self, when: float, callback: Callable[[], None]) -> asyncio.TimerHandle:
        self.timers += 1
        return self._loop.call_at(when, callback)

    def call_later(self, delay: float, callback: Callable[[], None]) -> asyncio.TimerHandle:
        self.timers += 1
        return self._loop.call_later(delay, callback)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loop, name)


def test_the_apps_unhandled_error_is_a_json_500() -> None:
    async def boom(scope: Any, receive: Any, send: Any) -> None:
        raise RuntimeError("bug")

    async def run() -> bytes:
        connection, transport = connect(boom)
        connection.data_received(GET)
        await settle()
        return bytes(transport.written)

    head, _, body = asyncio.run(run()).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 500 ")
    assert b"content-type: application/json" in head
    assert b"x-content-type-options: nosniff" in head
    assert json.loads(body) == {"error": {"code": "internal_error", "message": "internal server error"}}


def _timers_for_requests(requests: int) -> int:
    async def run() -> int:
        loop = CountingLoop(asyncio.get_running_loop())
        connection, transport = connect(ok, loop=loop)
        for _ in range(requests):
            connection.data_received(GET)
            await settle()
        assert transport.written.count(b"HTTP/1.1 200 ") == requests
        return loop.timers

    return asyncio.run(run())


def test_a_request_on_a_busy_connection_costs_no_timer() -> None:
    assert _timers_for_requests(200) <= 2  # not one keep-alive timer per request


def _upload(limits: EdgeLimits, app_waits: float, client_waits: float) -> bytes:
    """A 200 KiB body: 96 KiB at once, the rest after `client_waits`; the app reads after `app_waits`."""

    async def slow_reader(scope: Any, receive: Any, send: Any) -> None:
        await asyncio.sleep(app_waits)
        await ok(scope, receive, send)

    async def run() -> bytes:
        connection, transport = connect(slow_reader, limits)
        head = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (200 * 1024)
        connection.data_received(head + b"x" * 96 * 1024)
        assert transport.paused  # the edge stops reading past 64 KiB the app has not taken
        await asyncio.sleep(client_waits)
        if not transport.closed and not transport.eof:
            connection.data_received(b"x" * 104 * 1024)
        await asyncio.sleep(0.1)
        return bytes(transport.written)

    return asyncio.run(run())


def test_time_the_server_does_not_read_is_not_held_against_the_body() -> None:
    limits = EdgeLimits(body_timeout=0.2, body_min_rate=1024 * 1024)
    assert _upload(limits, app_waits=0.6, client_waits=0.7).startswith(b"HTTP/1.1 200 ")


def test_a_body_that_stalls_while_the_server_reads_gets_408() -> None:
    limits = EdgeLimits(body_timeout=0.2, body_min_rate=1024 * 1024)
    assert _upload(limits, app_waits=0.0, client_waits=0.6).startswith(b"HTTP/1.1 408 ")


def test_a_client_waiting_for_100_continue_is_not_timed_out() -> None:
    limits = EdgeLimits(body_timeout=0.2)

    async def late_reader(scope: Any, receive: Any, send: Any) -> None:
        await asyncio.sleep(0.5)  # longer than body_timeout before the app asks for the body
        await ok(scope, receive, send)

    async def run() -> bytes:
        connection, transport = connect(late_reader, limits)
        connection.data_received(b"POST / HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n")
        while b"100 Continue" not in transport.written:
            await asyncio.sleep(0.01)
        connection.data_received(b"hello")
        await settle()
        return bytes(transport.written)

    written = asyncio.run(run())
    assert written.startswith(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 ")
