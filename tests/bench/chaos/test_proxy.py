"""The chaos proxy against a real echo server on 127.0.0.1: each fault mode, backpressure, and the hub's threading."""

from __future__ import annotations

import asyncio
import socket
import socketserver
import threading
import time
from collections.abc import Iterator

import pytest

from app.bench.chaos.proxy import Fault, Link, Mode, ProxyHub

LINK = (1, 2)


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        try:
            while data := self.request.recv(65536):
                self.request.sendall(data)
        except OSError:
            pass


class _Sink(socketserver.BaseRequestHandler):
    """Accepts and never reads, so whatever is sent to it piles up."""

    def handle(self) -> None:
        self.server.release.wait(3)  # type: ignore[attr-defined]


def _serve(handler: type[socketserver.BaseRequestHandler]) -> Iterator[int]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    server.release = threading.Event()  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True).start()
    yield server.server_address[1]
    server.release.set()  # type: ignore[attr-defined]
    server.shutdown()
    server.server_close()


@pytest.fixture
def echo() -> Iterator[int]:
    yield from _serve(_Echo)


@pytest.fixture
def sink() -> Iterator[int]:
    yield from _serve(_Sink)


@pytest.fixture
def hub() -> Iterator[ProxyHub]:
    with ProxyHub(rng_seed=7) as h:
        yield h


def connect(port: int, timeout: float = 1.0) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def roundtrip(sock: socket.socket, data: bytes) -> bytes:
    sock.sendall(data)
    got = b""
    while len(got) < len(data):
        chunk = sock.recv(65536)
        if not chunk:
            break
        got += chunk
    return got


def ended(sock: socket.socket, within: float = 0.5) -> str:
    """How the connection ended: "eof" or "reset"; fails if it is still open after `within` seconds."""
    sock.settimeout(within)
    try:
        sock.sendall(b"ping")
    except (BrokenPipeError, ConnectionResetError):
        return "reset"
    try:
        while sock.recv(65536):
            pass  # an echo still in flight from before the fault
        return "eof"
    except ConnectionResetError:
        return "reset"
    except TimeoutError:
        pytest.fail("the connection is still open")


def silent(sock: socket.socket, wait: float = 0.25) -> bool:
    sock.settimeout(wait)
    try:
        sock.recv(65536)
    except TimeoutError:
        return True
    return False


def test_pass_forwards_both_ways_including_a_large_payload(hub: ProxyHub, echo: int) -> None:
    port = hub.add(LINK, echo)
    with connect(port, timeout=2) as sock:
        assert roundtrip(sock, b"hello") == b"hello"
        payload = bytes(range(256)) * (4 * 1024 * 1024 // 256)
        sender = threading.Thread(target=sock.sendall, args=(payload,))
        sender.start()
        got = bytearray()
        while len(got) < len(payload):
            chunk = sock.recv(1 << 20)
            assert chunk, "closed early"
            got += chunk
        sender.join()
        assert got == payload
    stats = hub.stats()[LINK]
    assert stats["accepted"] == 1 and stats["mode"] == "pass" and stats["port"] == port
    assert stats["to_target"] == stats["to_client"] == len(payload) + 5


def test_drop_closes_existing_connections_and_new_ones(hub: ProxyHub, echo: int) -> None:
    port = hub.add(LINK, echo)
    old = connect(port)
    assert roundtrip(old, b"a") == b"a"
    hub.set(LINK, Fault(Mode.DROP))
    start = time.monotonic()
    assert ended(old) in ("eof", "reset")
    new = connect(port)
    assert ended(new) in ("eof", "reset")
    assert time.monotonic() - start < 0.5
    assert hub.stats()[LINK]["drops"] == 2
    hub.heal_all()
    with connect(port) as sock:
        assert roundtrip(sock, b"back") == b"back"
    old.close()
    new.close()


def test_blackhole_is_silent_and_heal_closes_the_gapped_connections(hub: ProxyHub, echo: int) -> None:
    port = hub.add(LINK, echo)
    old = connect(port)
    assert roundtrip(old, b"a") == b"a"
    hub.set(LINK, Fault(Mode.BLACKHOLE))
    old.sendall(b"lost")
    new = connect(port)
    new.sendall(b"lost too")
    assert silent(old) and silent(new)
    hub.heal_all()
    for sock in (old, new):
        sock.settimeout(0.5)
        assert sock.recv(100) == b"", "bytes read in the blackhole came out after it"
        sock.close()
    with connect(port) as sock:
        assert roundtrip(sock, b"works") == b"works"


def test_delay_adds_latency_each_way_keeps_order_and_does_not_cap_throughput(hub: ProxyHub, echo: int) -> None:
    port = hub.add(LINK, echo)
    with connect(port) as sock:
        assert roundtrip(sock, b"warm") == b"warm"
        hub.set(LINK, Fault(Mode.DELAY, delay=0.1))
        start = time.monotonic()
        assert roundtrip(sock, b"x") == b"x"
        assert time.monotonic() - start >= 0.2
        # 20 chunks sent 10 ms apart: a serial sleep per chunk would take 20 * 0.1 s or more.
        start = time.monotonic()
        for i in range(20):
            sock.sendall(b"%02d," % i)
            time.sleep(0.01)
        expected = b"".join(b"%02d," % i for i in range(20))
        got = b""
        while len(got) < len(expected):
            got += sock.recv(1000)
        elapsed = time.monotonic() - start
        assert got == expected
        assert 0.2 + 0.19 <= elapsed < 0.8


def test_reset_resets_existing_and_new_connections(hub: ProxyHub, echo: int) -> None:
    port = hub.add(LINK, echo)
    old = connect(port)
    assert roundtrip(old, b"a") == b"a"
    hub.set(LINK, Fault(Mode.RESET))
    with pytest.raises(ConnectionResetError):
        old.recv(100)
    # The RST can beat connect() back to the caller, so either call may raise.
    with pytest.raises((ConnectionResetError, BrokenPipeError)), connect(port) as new:
        roundtrip(new, b"b")
    assert hub.stats()[LINK]["resets"] == 2
    old.close()


def test_flaky_loss_one_resets_on_the_first_chunk_and_loss_zero_passes(hub: ProxyHub, echo: int) -> None:
    port = hub.add(LINK, echo)
    hub.set(LINK, Fault(Mode.FLAKY, loss=1.0))
    with connect(port) as sock:
        assert ended(sock) == "reset"
    hub.set(LINK, Fault(Mode.FLAKY, loss=0.0))
    with connect(port) as sock:
        for i in range(20):
            assert roundtrip(sock, b"%d" % i) == b"%d" % i
    assert hub.stats()[LINK]["resets"] == 1


def test_set_all_and_heal_all(hub: ProxyHub, echo: int) -> None:
    ports = [hub.add((1, 2), echo), hub.add((2, 1), echo)]
    socks = [connect(p) for p in ports]
    hub.set_all(Fault(Mode.DROP))
    assert all(ended(s) in ("eof", "reset") for s in socks)
    assert all(s["mode"] == "drop" for s in hub.stats().values())
    hub.heal_all()
    assert all(s["mode"] == "pass" for s in hub.stats().values())
    for p in ports:
        with connect(p) as sock:
            assert roundtrip(sock, b"ok") == b"ok"
    for s in socks:
        s.close()


def test_stop_is_prompt_and_closes_everything(echo: int) -> None:
    hub = ProxyHub(rng_seed=1)
    hub.start()
    passing, holed = hub.add((1, 2), echo), hub.add((1, 3), echo)
    hub.set((1, 3), Fault(Mode.BLACKHOLE))
    delayed = hub.add((1, 4), echo)
    hub.set((1, 4), Fault(Mode.DELAY, delay=5))
    socks = [connect(p) for p in (passing, holed, delayed)]
    socks[2].sendall(b"queued for 5 s")
    assert roundtrip(socks[0], b"a") == b"a"
    start = time.monotonic()
    hub.stop()
    assert time.monotonic() - start < 1.0
    for s in socks:
        assert ended(s) in ("eof", "reset")
        s.close()
    with pytest.raises(ConnectionRefusedError):
        connect(passing)
    hub.stop()  # a second stop is harmless


def test_the_hub_is_driven_from_other_threads_and_event_loops(hub: ProxyHub, echo: int) -> None:
    ports: list[int] = []
    worker = threading.Thread(target=lambda: ports.append(hub.add(LINK, echo)))
    worker.start()
    worker.join()

    async def scenario() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", ports[0])
        writer.write(b"one")
        assert await asyncio.wait_for(reader.readexactly(3), 1) == b"one"
        hub.set(LINK, Fault(Mode.DROP))  # blocks briefly: from a coroutine on a loop that is not the hub's
        assert await asyncio.wait_for(reader.read(), 1) == b""
        writer.close()

    asyncio.run(scenario())
    setter = threading.Thread(target=hub.heal_all)
    setter.start()
    setter.join()
    with connect(ports[0]) as sock:
        assert roundtrip(sock, b"two") == b"two"
    with pytest.raises(ValueError):
        hub.add(LINK, echo)


def test_a_link_on_the_callers_loop_and_a_target_that_is_down() -> None:
    async def scenario() -> None:
        down = socket.socket()
        down.bind(("127.0.0.1", 0))
        link = Link(down.getsockname()[1])  # bound, not listening: connects are refused
        await link.start()
        reader, writer = await asyncio.open_connection("127.0.0.1", link.port)
        with pytest.raises((ConnectionResetError, asyncio.IncompleteReadError)):
            await asyncio.wait_for(reader.readexactly(1), 1)
        assert link.counters.accepted == 1 and link.counters.errors == 1
        writer.close()
        await link.close()
        down.close()

    asyncio.run(scenario())


def test_backpressure_stops_reading_from_a_sender_whose_target_does_not_read(hub: ProxyHub, sink: int) -> None:
    port = hub.add(LINK, sink)
    with connect(port) as sock:
        sock.setblocking(False)
        chunk, sent, deadline = b"x" * 65536, 0, time.monotonic() + 0.5
        while time.monotonic() < deadline and sent < 256 << 20:
            try:
                sent += sock.send(chunk)
            except BlockingIOError:
                time.sleep(0.005)
        forwarded = hub.stats()[LINK]["to_target"]
        # Kernel socket buffers hold some megabytes; the proxy itself holds at most about HIGH_WATER more.
        assert sent < 32 << 20, f"{sent} bytes accepted: the proxy buffers without bound"
        assert forwarded <= sent
