"""The protocol's contract with uvicorn and with the app: a standalone asyncio protocol that joins
uvicorn's connection and task sets, shuts down gracefully when told, and gives the app the scope an
ASGI server gives (addresses, scheme, root path, a copy of the lifespan state), keep-alive as HTTP
says, pipelined requests in order, an Upgrade request as plain HTTP, and an access line."""

from __future__ import annotations

import asyncio
import gc
import logging
from typing import Any

import pytest
from uvicorn.server import ServerState

from app.serving.connection import EdgeProtocol
from app.serving.cycle import EXTENSION
from tests.serving.harness import GET, FakeTransport, Recorder, connect, ok, settle, statuses


def test_it_inherits_nothing_from_uvicorn() -> None:
    assert all(not cls.__module__.startswith("uvicorn") for cls in EdgeProtocol.__mro__)
    assert issubclass(EdgeProtocol, asyncio.Protocol)


def test_it_joins_uvicorns_connections_and_tasks_and_counts_requests() -> None:
    async def run() -> None:
        state = ServerState()
        released = asyncio.Event()

        async def held(scope: Any, receive: Any, send: Any) -> None:
            await released.wait()
            await ok(scope, receive, send)

        connection, transport = connect(held, state=state)
        assert state.connections == {connection}
        connection.data_received(GET)
        await settle()
        assert len(state.tasks) == 1 and state.total_requests == 0
        released.set()
        await settle()
        assert statuses(transport.written) == [200]
        assert not state.tasks and state.total_requests == 1
        connection.connection_lost(None)
        assert not state.connections and transport.closed

    asyncio.run(run())


def test_shutdown_closes_an_idle_connection_at_once() -> None:
    async def run() -> None:
        connection, transport = connect(ok)
        connection.data_received(GET)
        await settle()
        assert not transport.closed
        connection.shutdown()
        assert transport.closed

    asyncio.run(run())


def test_shutdown_lets_a_response_under_way_finish_then_closes() -> None:
    async def run() -> None:
        released = asyncio.Event()

        async def slow(scope: Any, receive: Any, send: Any) -> None:
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
            await send({"type": "http.response.body", "body": b"a", "more_body": True})
            await released.wait()
            await send({"type": "http.response.body", "body": b"b"})

        connection, transport = connect(slow)
        connection.data_received(GET)
        await settle()
        connection.shutdown()
        assert not transport.closed
        released.set()
        await settle()
        assert transport.closed
        assert b"connection: close\r\n" not in transport.written  # the head was already out
        assert transport.written.endswith(b"1\r\nb\r\n0\r\n\r\n")

    asyncio.run(run())


async def long_poll(scope: Any, receive: Any, send: Any) -> None:
    """Waits, as a long-poll does, until `receive` reports its client left; then answers 204."""
    assert (await receive())["type"] == "http.request"  # the (empty) body
    assert (await receive())["type"] == "http.disconnect"
    await send({"type": "http.response.start", "status": 204, "headers": []})
    await send({"type": "http.response.body", "body": b""})


@pytest.mark.parametrize("pipelined", [False, True])
def test_shutdown_tells_a_live_read_its_client_left_so_it_answers_now(pipelined: bool) -> None:
    """A long-poll or SSE reader open at shutdown was held until uvicorn's graceful wait ran out and
    then cancelled: a 500 (or a cut stream) and an error in the log. It is told its client left, also
    with a request pipelined behind it (the stop once went to that one only)."""

    async def run() -> None:
        connection, transport = connect(long_poll)
        connection.data_received(GET + GET if pipelined else GET)
        await settle()
        assert not transport.written
        connection.shutdown()
        for _ in range(5):
            await settle()
        assert statuses(transport.written) == [204, 204] if pipelined else [204]  # the queued one too
        assert b"connection: close\r\n" in transport.written and transport.closed

    asyncio.run(run())


@pytest.mark.parametrize(
    "pieces",
    [
        [b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 4\r\n\r\nab", b"cd"],
        # The end marker after the stop was taken for a disconnect: 400 client_disconnected.
        [b"POST / HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n2\r\nab\r\n", b"2\r\ncd\r\n", b"0\r\n\r\n"],
    ],
)
def test_a_body_under_way_at_the_stop_is_received_whole(pieces: list[bytes]) -> None:
    async def run() -> None:
        bodies: list[bytes] = []

        async def upload(scope: Any, receive: Any, send: Any) -> None:
            while True:
                message = await receive()
                assert message["type"] == "http.request", bodies
                bodies.append(message["body"])
                if not message["more_body"]:
                    break
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
            await send({"type": "http.response.body", "body": b"ok"})

        connection, transport = connect(upload)
        connection.data_received(pieces[0])
        await settle()
        connection.shutdown()
        await settle()
        for piece in pieces[1:]:
            connection.data_received(piece)
            await settle()
        assert b"".join(bodies) == b"abcd" and statuses(transport.written) == [200]

    asyncio.run(run())


def test_a_response_cancelled_by_the_servers_stop_is_no_500(caplog: pytest.LogCaptureFixture) -> None:
    async def run() -> None:
        async def forever(scope: Any, receive: Any, send: Any) -> None:
            await asyncio.Event().wait()

        state = ServerState()
        connection, transport = connect(forever, state=state)
        connection.data_received(GET)
        await settle()
        for task in state.tasks:
            task.cancel()  # what uvicorn does once its graceful wait is over
        await settle()
        assert not transport.written and transport.closed

    with caplog.at_level(logging.ERROR):
        asyncio.run(run())
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_a_refused_connection_is_not_one_of_uvicorns() -> None:
    async def run() -> None:
        from app.serving.limits import EdgeLimits

        state = ServerState()
        limits = EdgeLimits(max_connections=1, max_connections_per_client=0)
        first, _ = connect(ok, limits, state=state)
        refused, transport = connect(ok, limits, state=state)
        assert transport.closed and statuses(transport.written) == [503]
        assert state.connections == {first}
        refused.shutdown()  # harmless, though uvicorn never calls it on a refused connection
        refused.connection_lost(None)
        assert state.connections == {first}

    asyncio.run(run())


def test_the_scope_is_an_asgi_servers() -> None:
    async def run() -> None:
        app = Recorder()
        lifespan_state = {"stores": "opened"}
        tls = FakeTransport({"sslcontext": object(), "peername": ("10.1.2.3", 40000), "sockname": ("10.0.0.1", 443)})
        connection, transport = connect(app, app_state=lifespan_state, transport=tls, root_path="/rill")
        head = b"GET /v1/stream/a%2Fb?offset=-1 HTTP/1.1\r\nHost: x\r\nX-Twice: 1\r\nx-twice: 2\r\n\r\n"
        connection.data_received(head)
        await settle()
        scope, _ = app.requests[0]
        assert scope["type"] == "http" and scope["asgi"] == {"version": "3.0", "spec_version": "2.3"}
        assert (scope["scheme"], scope["server"], scope["client"]) == ("https", ("10.0.0.1", 443), ("10.1.2.3", 40000))
        assert (scope["method"], scope["http_version"], scope["root_path"]) == ("GET", "1.1", "/rill")
        assert (scope["path"], scope["raw_path"]) == ("/rill/v1/stream/a/b", b"/rill/v1/stream/a%2Fb")
        assert scope["query_string"] == b"offset=-1"
        assert scope["headers"] == [(b"host", b"x"), (b"x-twice", b"1"), (b"x-twice", b"2")]
        assert app.extensions[0][EXTENSION] is not None
        assert scope["extensions"] == {}  # cleared once answered: no reference cycle left for the GC
        # The state is a copy per request: what one request sets is not seen by the next.
        assert scope["state"] == lifespan_state and scope["state"] is not lifespan_state
        scope["state"]["mine"] = True
        connection.data_received(GET)
        await settle()
        assert "mine" not in app.requests[1][0]["state"] and "mine" not in lifespan_state
        assert statuses(transport.written) == [200, 200]

    asyncio.run(run())


@pytest.mark.parametrize(
    ("request_head", "kept"),
    [
        (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", True),
        (b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", False),
        (b"GET / HTTP/1.0\r\n\r\n", False),
        (b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", False),  # HTTP/1.0: answered and closed
    ],
)
def test_keep_alive_follows_the_request(request_head: bytes, kept: bool) -> None:
    async def run() -> tuple[bytes, bool]:
        connection, transport = connect(ok)
        connection.data_received(request_head)
        await settle()
        return bytes(transport.written), transport.closed

    written, closed = asyncio.run(run())
    assert statuses(written) == [200]
    assert closed is not kept
    assert (b"connection: close\r\n" in written) is not kept


def test_pipelined_requests_are_answered_in_order_one_at_a_time() -> None:
    async def run() -> None:
        app = Recorder()
        connection, transport = connect(app)
        posts = b"".join(b"POST /%d HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\n%d" % (i, i) for i in range(3))
        connection.data_received(posts)
        assert transport.paused  # queued requests: nothing more is read meanwhile
        await settle()
        assert [(scope["path"], body) for scope, body in app.requests] == [("/0", b"0"), ("/1", b"1"), ("/2", b"2")]
        assert statuses(transport.written) == [200, 200, 200]
        assert transport.written.endswith(b"\r\n\r\n2") and not transport.paused and not transport.closed

    asyncio.run(run())


def test_nothing_more_is_read_while_pipelined_requests_wait() -> None:
    async def run() -> list[bool]:
        transport = FakeTransport()
        reading: list[bool] = []

        async def app(scope: Any, receive: Any, send: Any) -> None:  # a GET's: it never asks for the body
            reading.append(not transport.paused)  # when this request starts
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"0")]})
            await send({"type": "http.response.body", "body": b""})

        connection, _ = connect(app, transport=transport)
        connection.data_received(GET * 4)
        await settle()
        assert statuses(transport.written) == [200] * 4 and not transport.paused
        return reading

    # Reading stops once requests queue, and resumes only when the last of them starts.
    assert asyncio.run(run()) == [False, False, False, True]


def test_an_upgrade_request_is_answered_as_plain_http() -> None:
    async def run() -> bytes:
        app = Recorder()
        connection, transport = connect(app)
        upgrade = b"GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"
        connection.data_received(upgrade)
        await settle()
        assert app.requests[0][0]["path"] == "/ws"
        return bytes(transport.written)

    assert statuses(asyncio.run(run())) == [200]


def test_an_access_line_per_response(caplog: pytest.LogCaptureFixture) -> None:
    async def run() -> None:
        connection, _ = connect(ok)
        connection.data_received(b"GET /v1/stream/a%20b?offset=-1 HTTP/1.1\r\nHost: x\r\n\r\n")
        await settle()

    with caplog.at_level(logging.INFO, logger="uvicorn.access"):
        asyncio.run(run())
    lines = [record for record in caplog.records if record.name == "uvicorn.access"]
    line = '127.0.0.1:50000 - "GET /v1/stream/a%20b?offset=-1 HTTP/1.1" 200'
    assert [record.getMessage() for record in lines] == [line]
    assert lines[0].args == ("127.0.0.1:50000", "GET", "/v1/stream/a%20b?offset=-1", "1.1", 200)


def test_answered_requests_leave_nothing_for_the_garbage_collector() -> None:
    """A request's objects go when it is answered, by reference counting: a reference cycle per
    request (the scope's extensions held the cycle, whose scope held them) once filled the young
    generation with whole requests, and the collector then paused the server 10 ms at a time."""

    async def answer(scope: Any, receive: Any, send: Any) -> None:  # keeps nothing of the request
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    async def run() -> int:
        connection, transport = connect(answer)
        connection.data_received(GET)  # the first request makes what the connection keeps
        await settle()
        gc.collect()
        gc.disable()
        try:
            for _ in range(200):
                connection.data_received(GET)
                await settle()
            found = gc.collect()
        finally:
            gc.enable()
        assert statuses(transport.written) == [200] * 201
        return found

    found = asyncio.run(run())
    assert found < 50  # 200 requests: nothing per request (before: 6 objects each)
