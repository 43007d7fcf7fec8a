"""Requests that once left the edge wrong, in-process: an Upgrade request's body read as requests of
its own, a response under way that never heard its client leave because a request was queued
behind it, a connection kept after a 100 Continue that never came,, a bad header answered by a
silent close, and chunks sent to HTTP/1.0."""

from __future__ import annotations

import asyncio
from typing import Any

from tests.serving.harness import GET, Recorder, connect, ok, settle, statuses

SMUGGLED = b"DELETE /victim HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"


def _upgrade(body: bytes, framing: bytes | None = None) -> bytes:
    framing = b"Content-Length: %d\r\n" % len(body) if framing is None else framing
    return b"POST /s HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: foo\r\n" + framing + b"\r\n" + body


def test_an_upgrade_request_with_a_body_is_refused_and_its_body_never_runs_as_a_request() -> None:
    async def run(first: bytes, later: bytes) -> tuple[Recorder, bytes, bool]:
        app = Recorder()
        connection, transport = connect(app)
        connection.data_received(first)
        await settle()
        connection.data_received(later)
        await settle()
        return app, bytes(transport.written), transport.closed or transport.eof

    for first, later in (
        (_upgrade(SMUGGLED), b""),  # in the same read as the head
        (_upgrade(SMUGGLED)[: -len(SMUGGLED)], SMUGGLED),  # in a read of its own
        (_upgrade(b"", b"Transfer-Encoding: chunked\r\n"), b"%x\r\n%b\r\n0\r\n\r\n" % (len(SMUGGLED), SMUGGLED)),
    ):
        app, written, ended = asyncio.run(run(first, later))
        assert app.requests == [] and statuses(written) == [400] and ended, written


def test_an_upgrade_request_without_a_body_is_answered_and_nothing_after_it_is_read() -> None:
    async def run() -> tuple[Recorder, bytes, bool]:
        app = Recorder()
        connection, transport = connect(app)
        connection.data_received(_upgrade(b"") + SMUGGLED)
        await settle()
        connection.data_received(GET)
        await settle()
        return app, bytes(transport.written), transport.closed

    app, written, closed = asyncio.run(run())
    assert [scope["path"] for scope, _ in app.requests] == ["/s"]
    assert statuses(written) == [200] and b"connection: close\r\n" in written and closed


def test_a_response_under_way_hears_its_client_leave_with_a_request_queued_behind_it() -> None:
    async def run() -> list[str]:
        seen: list[str] = []

        async def app(scope: Any, receive: Any, send: Any) -> None:
            if scope["path"] == "/live":
                await send({"type": "http.response.start", "status": 200, "headers": []})
                while (await receive())["type"] != "http.disconnect":
                    pass
                seen.append(scope["path"])
                return
            await ok(scope, receive, send)

        connection, transport = connect(app)
        connection.data_received(b"GET /live HTTP/1.1\r\nHost: x\r\n\r\n" + GET)
        await settle()
        assert connection.pipeline  # "/" waits behind "/live"
        connection.connection_lost(None)
        await settle()
        return seen

    assert asyncio.run(run()) == ["/live"]


def test_an_answer_before_the_100_continue_ends_the_connection() -> None:
    async def run() -> tuple[bytes, bool]:
        async def refuse(scope: Any, receive: Any, send: Any) -> None:  # answers without reading the body
            await send({"type": "http.response.start", "status": 413, "headers": [(b"content-length", b"0")]})
            await send({"type": "http.response.body", "body": b""})

        connection, transport = connect(refuse)
        connection.data_received(b"POST / HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 9999\r\n\r\n")
        await settle()
        return bytes(transport.written), transport.closed

    written, closed = asyncio.run(run())
    assert statuses(written) == [413] and b"100 Continue" not in written
    assert b"connection: close\r\n" in written and closed  # what the client sends next is not read as a body


def test_a_response_header_that_cannot_be_written_gets_a_500() -> None:
    async def run() -> bytes:
        async def bad(scope: Any, receive: Any, send: Any) -> None:
            headers = [(b"x-name", b"one\r\nset-cookie: injected")]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": b""})

        connection, transport = connect(bad)
        connection.data_received(GET)
        await settle()
        return bytes(transport.written)

    written = asyncio.run(run())
    assert statuses(written) == [500] and b"injected" not in written


def test_a_streamed_answer_to_http_1_0_is_not_chunked_and_ends_with_the_connection() -> None:
    async def run(version: bytes) -> tuple[bytes, bool]:
        async def stream(scope: Any, receive: Any, send: Any) -> None:
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
            for part in (b"one ", b"two"):
                await send({"type": "http.response.body", "body": part, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})

        connection, transport = connect(stream)
        connection.data_received(b"GET / HTTP/%b\r\nHost: x\r\n\r\n" % version)
        await settle()
        return bytes(transport.written), transport.closed

    written, closed = asyncio.run(run(b"1.0"))
    head, _, body = written.partition(b"\r\n\r\n")
    assert b"transfer-encoding" not in head.lower() and b"connection: close" in head and body == b"one two" and closed
    written, closed = asyncio.run(run(b"1.1"))
    assert b"transfer-encoding: chunked" in written and written.endswith(b"0\r\n\r\n") and not closed
