"""Connections per client address (max_connections_per_client): one address past its share gets a
503 and a close before anything is read, while other addresses still get in; its count goes down as
its connections close; the global cap still holds; 0 turns the per-client limit off.

Linux routes all of 127.0.0.0/8 to loopback, so a test can be several clients: a socket bound to
127.0.0.2 before it connects is another address to the server."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.serving.clients import ClientSlots, client_key
from app.serving.connection import protocol_for
from app.serving.limits import EdgeLimits
from tests.server import RillProcess
from tests.serving.harness import FakeTransport, ok
from tests.serving.wire import Answer, assert_error, parse, read_to_close, ready

CAP = 16  # max_connections of the process below: a quarter, 4, per address


def _server(path: Path, config: str) -> RillProcess:
    (path / "edge.toml").write_text(config)
    return RillProcess(path / "data", None, "--config", str(path / "edge.toml")).start()


@pytest.fixture(scope="module")
def capped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RillProcess]:
    # A long keep-alive timeout: the idle connections the tests hold stay open.
    server = _server(tmp_path_factory.mktemp("clients"), f"max_connections = {CAP}\nkeepalive_timeout = 60\n")
    yield server
    server.stop()


def _open(port: int, source: str, count: int = 1) -> list[socket.socket]:
    sockets = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0))
        sockets.append(sock)
    return sockets


def _refused(sockets: list[socket.socket], wait: float = 0.5) -> list[Answer]:
    """The answers of the connections the server refused (it answers those at once, then closes)."""
    time.sleep(wait)  # the server has seen every connection
    return [parse(raw) for raw in (read_to_close(s, 5) for s in ready(sockets, 0)) if raw]


def _close(sockets: list[socket.socket]) -> None:
    for sock in sockets:
        sock.close()
    time.sleep(0.3)  # the server has seen the closes


def _healthz(port: int, source: str) -> int:
    transport = httpx.HTTPTransport(local_address=source)
    with httpx.Client(transport=transport, timeout=10) as client:
        return client.get(f"http://127.0.0.1:{port}/healthz").status_code


def test_one_address_gets_a_quarter_of_the_connections_and_others_still_get_in(capped: RillProcess) -> None:
    held = _open(capped.port, "127.0.0.1", CAP // 4)
    try:
        assert _refused(held) == []
        (refused,) = _refused(_open(capped.port, "127.0.0.1"))
        assert_error(refused, 503, "too_many_connections_from_client")
        assert refused.headers["retry-after"] == "1"
        assert _healthz(capped.port, "127.0.0.2") == 200  # another client is not held back
        # A connection closed makes room for one more from the same address.
        _close(held[:1])
        again = _open(capped.port, "127.0.0.1")
        assert _refused(again) == []
        held = held[1:] + again
    finally:
        _close(held)
    # All closed: the address's count is back to zero, so its full share gets in again.
    held = _open(capped.port, "127.0.0.1", CAP // 4)
    try:
        assert _refused(held) == []
        assert len(_refused(_open(capped.port, "127.0.0.1"))) == 1
    finally:
        _close(held)
    assert _healthz(capped.port, "127.0.0.1") == 200
    assert "max_connections_per_client (4) reached by 127.0.0.1" in capped.log_path.read_text()


def test_the_global_cap_still_holds(capped: RillProcess) -> None:
    held = [sock for n in range(4) for sock in _open(capped.port, f"127.0.0.{10 + n}", CAP // 4)]
    try:
        assert _refused(held) == []
        (refused,) = _refused(_open(capped.port, "127.0.0.20"))
        assert_error(refused, 503, "too_many_connections")
        assert refused.headers["retry-after"] == "1"
    finally:
        _close(held)
    assert _healthz(capped.port, "127.0.0.20") == 200


def test_zero_turns_the_per_client_limit_off(tmp_path: Path) -> None:
    server = _server(tmp_path, "max_connections = 8\nmax_connections_per_client = 0\nkeepalive_timeout = 60\n")
    try:
        held = _open(server.port, "127.0.0.1", 8)
        try:
            assert _refused(held) == []  # one address may take every slot
            (refused,) = _refused(_open(server.port, "127.0.0.1"))
            assert_error(refused, 503, "too_many_connections")
        finally:
            _close(held)
    finally:
        server.stop()


# In process: the grouping of addresses, and the count over a connection's life.


@pytest.mark.parametrize(
    ("peername", "key"),
    [
        (("203.0.113.7", 5000), "203.0.113.7"),
        (("127.0.0.1", 5000), "127.0.0.1"),
        (("2001:db8:1:2:aaaa::1", 5000, 0, 0), "2001:db8:1:2::/64"),
        (("2001:db8:1:2:bbbb::9", 5000, 0, 0), "2001:db8:1:2::/64"),  # the same /64: the same client
        (("2001:db8:1:3::1", 5000, 0, 0), "2001:db8:1:3::/64"),
        (("::ffff:198.51.100.4", 5000, 0, 0), "198.51.100.4"),
        (("fe80::1%eth0", 5000, 0, 2), "fe80::/64"),
        (("::1", 5000, 0, 0), "::/64"),
        ("/run/rill.sock", None),  # a Unix socket: not counted
        (None, None),
    ],
)
def test_a_client_is_its_ipv4_address_or_its_ipv6_64(peername: Any, key: str | None) -> None:
    assert client_key(peername) == key


class PeerTransport(FakeTransport):
    def __init__(self, host: str) -> None:
        super().__init__()
        self.host = host

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return (self.host, 50000) if name == "peername" else super().get_extra_info(name, default)


def test_counts_follow_connections_and_refusals_count_nothing() -> None:
    from uvicorn.config import Config
    from uvicorn.server import ServerState

    protocol = protocol_for(EdgeLimits(max_connections=100, max_connections_per_client=2))

    async def run() -> None:
        loop = asyncio.get_running_loop()
        config = Config(app=ok, http=protocol, ws="none", lifespan="off", log_config=None, proxy_headers=False)
        config.load()
        state = ServerState()

        def connect(host: str) -> tuple[Any, PeerTransport]:
            connection = protocol(config, state, {}, _loop=loop)
            transport = PeerTransport(host)
            connection.connection_made(transport)
            return connection, transport

        opened = [connect("198.51.100.1") for _ in range(2)]
        refused, transport = connect("198.51.100.1")
        assert transport.closed and transport.written.startswith(b"HTTP/1.1 503 ")
        assert b'"too_many_connections_from_client"' in transport.written
        assert b"retry-after: 1\r\n" in transport.written
        other, other_transport = connect("198.51.100.2")
        assert not other_transport.closed
        assert protocol.clients.counts == {"198.51.100.1": 2, "198.51.100.2": 1}
        refused.connection_lost(None)  # its close: nothing was counted for it
        assert protocol.clients.counts == {"198.51.100.1": 2, "198.51.100.2": 1}
        for connection, _ in [*opened, (other, other_transport)]:
            connection.connection_lost(None)
        assert protocol.clients.counts == {}
        # An exempt address (a cluster's node) is not counted, whatever it holds.
        protocol.clients.exempt = frozenset({"198.51.100.1"})
        peers = [connect("198.51.100.1") for _ in range(5)]
        assert not any(t.closed for _, t in peers) and protocol.clients.counts == {}
        for connection, _ in peers:
            connection.connection_lost(None)

    asyncio.run(run())


def test_the_peers_addresses_are_exempt() -> None:
    slots = ClientSlots(4)
    urls = ["http://127.0.0.1:4437", "https://[2001:db8::7]:4437", "http://localhost:4438", ""]
    assert asyncio.run(slots.exempt_peers(urls))
    assert {"127.0.0.1", "2001:db8::/64"} <= slots.exempt
    assert not slots.counted("127.0.0.1") and slots.counted("127.0.0.2") and not slots.counted(None)
    assert not asyncio.run(slots.exempt_peers(["http://no-such-host.invalid:4437"]))
    assert slots.exempt == frozenset()
