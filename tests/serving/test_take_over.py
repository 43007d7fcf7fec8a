"""An accepted Upgrade hands the connection to another protocol (the Raft channel does this): its
101 goes out, and the edge's request, timers, connection count and per-client slot are done with."""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.server import ServerState

from app.serving.cycle import TAKE_OVER
from app.serving.limits import EdgeLimits
from tests.serving.harness import FakeTransport, connect, settle

UPGRADE = b"GET /x HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: test-1\r\n\r\n"
HEAD = b"HTTP/1.1 101 Switching Protocols\r\nupgrade: test-1\r\nconnection: Upgrade\r\n\r\n"


class Taken(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.BaseTransport | None = None
        self.data = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.data += data


class SwitchingTransport(FakeTransport):
    def __init__(self) -> None:
        super().__init__()
        self.protocol: Any = None

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self.protocol = protocol

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self.protocol


def test_an_upgrade_the_app_accepts_takes_the_connection_over() -> None:
    taken = Taken()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        scope["extensions"][TAKE_OVER](HEAD, taken)

    async def run() -> tuple[Any, SwitchingTransport, ServerState]:
        state = ServerState()
        limits = EdgeLimits(keepalive_timeout=0.05, header_timeout=0.05, max_connections_per_client=1)
        connection, transport = connect(app, limits, state=state, transport=SwitchingTransport())
        assert connection in state.connections and type(connection).clients.counts == {"127.0.0.1": 1}
        connection.data_received(UPGRADE)
        await settle()
        await asyncio.sleep(0.2)  # past every timeout of the edge: none of them fires any more
        return connection, transport, state  # type: ignore[return-value]

    connection, transport, state = asyncio.run(run())
    assert bytes(transport.written) == HEAD, "the 101 alone: no 500 from the edge after the app returned"
    assert transport.protocol is taken and taken.transport is transport
    assert not transport.closed
    assert connection not in state.connections
    assert type(connection).clients.counts == {}, "the address's slot went back"


def test_a_connection_closed_before_it_is_taken_over_is_not() -> None:
    taken = Taken()
    refused: list[BaseException] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        try:
            scope["extensions"][TAKE_OVER](HEAD, taken)
        except ConnectionError as exc:
            refused.append(exc)

    async def run() -> SwitchingTransport:
        connection, transport = connect(app, transport=SwitchingTransport())
        connection.data_received(UPGRADE)
        transport.closed = True
        await settle()
        return transport  # type: ignore[return-value]

    transport = asyncio.run(run())
    assert refused and transport.protocol is None and taken.transport is None
