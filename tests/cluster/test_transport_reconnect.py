"""The Raft sender survives a peer that closes its connections: one closed while idle (the peer's
keep-alive timeout) is replaced before use, and a request that fails on a reused connection is sent
once more on a fresh one."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from app.cluster.transport import Transport, decode
from app.raft.messages import AppendResponse, Message

pytestmark = pytest.mark.anyio
SECRET = b"s3cret"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Peer:
    """A peer that answers 200 and then closes idle connections after `idle` seconds, or (with
    `drop_reused`) closes a reused connection on its next request without answering."""

    def __init__(self, idle: float, drop_reused: bool = False) -> None:
        self.idle = idle
        self.drop_reused = drop_reused
        self.received: list[Message] = []
        self.connections = 0
        self.arrived = asyncio.Event()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        served = 0
        try:
            while True:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.idle)
                lines = head.lower().split(b"\r\n")
                length = next(int(line.split(b":")[1]) for line in lines if line.startswith(b"content-length"))
                body = await reader.readexactly(length)
                if served and self.drop_reused:
                    return  # closed with the request unanswered, as a peer closing it just then would
                self.received.extend(decode(body))
                self.arrived.set()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
                served += 1
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@contextlib.asynccontextmanager
async def _sending_to(peer: Peer) -> AsyncIterator[Transport]:
    server = await asyncio.start_server(peer.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    transport = Transport(1, {1: "", 2: f"http://127.0.0.1:{port}"}, SECRET)
    transport.start()
    try:
        yield transport
    finally:
        await transport.close()
        server.close()


def _ack(n: int) -> AppendResponse:
    return AppendResponse(term=1, src=1, dst=2, success=True, match_index=n)


async def _delivered(peer: Peer, count: int) -> None:
    while len(peer.received) < count:
        peer.arrived.clear()
        await asyncio.wait_for(peer.arrived.wait(), 2)


async def test_a_connection_the_peer_closed_while_idle_is_replaced() -> None:
    peer = Peer(idle=0.1)
    async with _sending_to(peer) as transport:
        await transport.send([_ack(1)])
        await _delivered(peer, 1)
        await asyncio.sleep(0.4)  # the peer has closed the idle connection
        await transport.send([_ack(2)])
        await _delivered(peer, 2)
    assert [m.match_index for m in peer.received if isinstance(m, AppendResponse)] == [1, 2]
    assert peer.connections == 2


async def test_a_request_lost_on_a_reused_connection_is_sent_again_on_a_fresh_one() -> None:
    peer = Peer(idle=60, drop_reused=True)
    async with _sending_to(peer) as transport:
        await transport.send([_ack(1)])
        await _delivered(peer, 1)
        await transport.send([_ack(2)])  # the peer drops the reused connection with it unanswered
        await _delivered(peer, 2)
    assert [m.match_index for m in peer.received if isinstance(m, AppendResponse)] == [1, 2]
    assert peer.connections == 2


async def test_a_peer_route_is_dialed_instead_of_the_member_url() -> None:
    """--peer-routes: the messages reach the route (a proxy in between); the member URL is never dialed."""
    peer = Peer(idle=60)
    server = await asyncio.start_server(peer.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    transport = Transport(1, {1: "", 2: "http://127.0.0.1:1"}, SECRET, routes={2: f"http://127.0.0.1:{port}"})
    transport.start()
    try:
        assert transport.peers == {2: f"http://127.0.0.1:{port}"}
        await transport.send([_ack(1)])
        await _delivered(peer, 1)
        transport.set_peers({1: "", 2: "http://127.0.0.1:1", 3: "http://127.0.0.1:2"})  # membership changes
        assert transport.peers == {2: f"http://127.0.0.1:{port}", 3: "http://127.0.0.1:2"}
    finally:
        await transport.close()
        server.close()
