"""A flood of idle sockets on a process with 1,024 fds: past the cap new connections get a 503 and a
close, the stores keep their fds, and the idle sockets are reclaimed by the keep-alive timeout. From
one address the flood takes a quarter of the connections (max_connections_per_client), not all."""

from __future__ import annotations

import resource
import select
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.server import RillProcess
from tests.serving.wire import assert_error, parse, read_to_close, ready

FD_LIMIT = 1024
FLOOD = 1100
KEEPALIVE_TIMEOUT = 4.0
CAP = FD_LIMIT - 256 - 64  # the fd reserve and the listen backlog of a 1,024-fd process
PER_CLIENT = CAP // 4  # max_connections_per_client's default


def _limit_fds() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT, FD_LIMIT))


def _small(tmp_path: Path, config: str) -> RillProcess:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = FLOOD + 256  # this test's own sockets
    if soft < needed:
        if hard != resource.RLIM_INFINITY and hard < needed:
            pytest.skip(f"the test needs {needed} fds; the hard limit is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
    path = tmp_path / "edge.toml"
    path.write_text(f"keepalive_timeout = {KEEPALIVE_TIMEOUT}\n{config}")
    return RillProcess(tmp_path / "data", None, "--config", str(path), preexec_fn=_limit_fds).start()


@pytest.fixture()
def small(tmp_path: Path) -> Iterator[RillProcess]:
    server = _small(tmp_path, "max_connections_per_client = 0\n")  # the flood's one address may take every slot
    yield server
    server.stop()


def _flood(port: int) -> list[socket.socket]:
    """FLOOD connections, opened without waiting on each: a connect whose SYN found the listen queue
    full completes on the retransmit, a second later, while the others are still idle."""
    sockets = []
    for i in range(FLOOD):
        sock = socket.socket()
        sock.setblocking(False)
        sock.connect_ex(("127.0.0.1", port))
        sockets.append(sock)
        if i % 16 == 15:
            time.sleep(0.002)  # paced a little: the server accepts slower than a tight loop connects
    poller = select.poll()
    for sock in sockets:
        poller.register(sock, select.POLLOUT)
    pending, deadline = len(sockets), time.monotonic() + 8
    while pending and time.monotonic() < deadline:
        for fd, _ in poller.poll(500):
            poller.unregister(fd)
            pending -= 1
    connected = [s for s in sockets if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0]
    for sock in sockets:
        if sock not in connected:
            sock.close()
    return connected


def _settled(sockets: list[socket.socket], held: int) -> set[socket.socket]:
    """The sockets the server has answered or closed. A loaded server may still have some of the
    flood in its accept queue: those look held until it accepts and refuses them, so wait (less than
    the keep-alive timeout: three quarters of it, as CI needed more than half once) until no more
    than `held` are left unanswered."""
    time.sleep(0.5)
    readable, deadline = set(ready(sockets, 0)), time.monotonic() + KEEPALIVE_TIMEOUT * 0.75
    while len(sockets) - len(readable) > held and time.monotonic() < deadline:
        time.sleep(0.2)
        readable = set(ready(sockets, 0))
    return readable


def test_an_idle_flood_is_capped_and_reclaimed(small: RillProcess) -> None:
    url = small.url + "/v1/stream/flood"
    assert httpx.put(url, headers={"content-type": "text/plain"}, timeout=10).status_code == 201
    sockets = _flood(small.port)
    try:
        assert len(sockets) >= FLOOD * 0.9, "the server stopped accepting"
        readable = _settled(sockets, CAP)
        refused = [parse(raw) for raw in (read_to_close(s, 5) for s in readable) if raw]
        assert refused, "nothing was refused past the cap"
        for reply in refused:
            assert_error(reply, 503, "too_many_connections")
            assert reply.headers["retry-after"] == "1"
        held = len(sockets) - len(readable)
        assert 0 < held <= CAP, f"{held} idle connections held on {FD_LIMIT} fds"

        # Writes while the cap is reached are refused with a 503 or a close, never a crash.
        try:
            status = httpx.post(url, content=b"during", headers={"content-type": "text/plain"}, timeout=10).status_code
            assert status in (204, 503)
        except httpx.TransportError:
            pass
        assert small.alive()

        # The keep-alive timeout reclaims the idle sockets: every one is closed by the server.
        deadline = time.monotonic() + KEEPALIVE_TIMEOUT + 5
        idle = [s for s in sockets if s not in readable]
        while idle and time.monotonic() < deadline:
            closed = ready(idle, 0.5)
            for sock in closed:
                assert read_to_close(sock, 5) == b""
            idle = [s for s in idle if s not in closed]
        assert not idle, f"{len(idle)} idle connections were never closed"
    finally:
        for sock in sockets:
            sock.close()

    assert httpx.post(url, content=b"after", headers={"content-type": "text/plain"}, timeout=10).status_code == 204
    assert httpx.get(url, params={"offset": "-1"}, timeout=10).content.endswith(b"after")
    assert small.alive()
    assert "Too many open files" not in small.log_path.read_text()


def test_a_flood_from_one_address_leaves_the_other_clients_room(tmp_path: Path) -> None:
    server = _small(tmp_path, "")
    url = server.url + "/v1/stream/flood"
    try:
        assert httpx.put(url, headers={"content-type": "text/plain"}, timeout=10).status_code == 201
        sockets = _flood(server.port)
        try:
            readable = _settled(sockets, PER_CLIENT)
            refused = [parse(raw) for raw in (read_to_close(s, 5) for s in readable) if raw]
            assert refused, "nothing was refused past the per-client cap"
            for reply in refused:
                assert_error(reply, 503, "too_many_connections_from_client")
                assert reply.headers["retry-after"] == "1"
            held = len(sockets) - len(readable)  # idle ones the keep-alive timeout closed are not held
            assert 0 < held <= PER_CLIENT, f"{held} connections held from one address"
            # Another client gets in while the flood holds its share (before, all 704 were taken).
            other = httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.2"), timeout=10)
            with other:
                assert other.post(url, content=b"during", headers={"content-type": "text/plain"}).status_code == 204
        finally:
            for sock in sockets:
                sock.close()
        assert server.alive()
    finally:
        server.stop()
