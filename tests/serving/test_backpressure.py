"""A client that never reads its responses: the app's writes wait while the transport is full, a
disconnect releases them, and over a real socket such a client holds a bounded amount of the
server's memory while every other client is served."""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path
from typing import Any

import httpx

from tests.server import RillProcess
from tests.serving.harness import GET, connect, settle, statuses


class Streamer:
    """Writes chunks until told to stop, counting those the transport took."""

    def __init__(self) -> None:
        self.sent = 0
        self.finished = False

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        for _ in range(100):
            await send({"type": "http.response.body", "body": b"x" * 1024, "more_body": True})
            self.sent += 1
        await send({"type": "http.response.body", "body": b""})
        self.finished = True


def test_writes_wait_while_the_transport_is_full_and_resume_when_it_drains() -> None:
    async def run() -> None:
        app = Streamer()
        connection, transport = connect(app)
        connection.pause_writing()  # the client reads nothing: the transport's buffer is full
        connection.data_received(GET)
        await settle()
        assert app.sent == 0 and not app.finished  # not even the head: send() waits first
        connection.resume_writing()
        await settle()
        assert app.sent > 0
        connection.pause_writing()
        await settle()
        held = app.sent
        await settle()
        assert app.sent == held  # paused again: nothing more is written
        connection.resume_writing()
        while not app.finished:
            await asyncio.sleep(0)
        assert statuses(transport.written) == [200] and transport.written.endswith(b"0\r\n\r\n")

    asyncio.run(run())


def test_a_client_gone_while_writes_wait_releases_the_app() -> None:
    async def run() -> None:
        app = Streamer()
        connection, transport = connect(app)
        connection.pause_writing()
        connection.data_received(GET)
        await settle()
        task = next(iter(connection.tasks))  # waiting to write the head
        connection.connection_lost(ConnectionResetError())
        await asyncio.wait_for(task, 1)  # its sends return at once: nobody reads them
        assert app.finished and transport.written == b""
        assert not connection.connections and not connection.tasks

    asyncio.run(run())


def _rss(server: RillProcess) -> int:
    assert server.proc is not None
    for line in Path(f"/proc/{server.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_a_client_that_never_reads_holds_little_and_blocks_no_one(edge: RillProcess) -> None:
    before = _rss(edge)
    request = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    with socket.create_connection(("127.0.0.1", edge.port), timeout=10) as hog:
        hog.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        hog.settimeout(0.2)
        sent = 0
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # pipelined requests, their answers never read
            try:
                hog.sendall(request * 256)
                sent += 256
            except TimeoutError:
                break  # the server stopped reading: its answers have nowhere to go
        assert sent < 1_000_000, "the server kept reading requests whose answers pile up"
        for _ in range(5):
            assert httpx.get(edge.url + "/healthz", timeout=5).status_code == 200
        assert _rss(edge) - before < 32 << 20
    # Closed by the client: the server lets it go, and stays healthy.
    assert httpx.get(edge.url + "/healthz", timeout=5).status_code == 200
    assert edge.alive()
