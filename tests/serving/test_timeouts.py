"""Slow and silent clients time out; a long-poll, whose request is complete, does not."""

from __future__ import annotations

import socket
import threading
import time

import httpx

from tests.server import RillProcess
from tests.serving.wire import answer, assert_error, connect, drip, read_response, read_to_close, send

HEADER_TIMEOUT = 1.5
KEEPALIVE_TIMEOUT = 2.0


def test_a_connection_that_sends_nothing_is_closed_silently(edge: RillProcess) -> None:
    with connect(edge.port) as sock:
        start = time.monotonic()
        assert read_to_close(sock) == b""
        assert KEEPALIVE_TIMEOUT - 0.2 <= time.monotonic() - start <= KEEPALIVE_TIMEOUT + 1.5


def test_an_idle_keep_alive_connection_is_closed_after_its_requests(edge: RillProcess) -> None:
    with connect(edge.port) as sock:
        for _ in range(3):
            assert send(sock, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert read_response(sock).status == 200
            time.sleep(KEEPALIVE_TIMEOUT / 2)  # each request restarts the idle clock
        start = time.monotonic()
        assert read_to_close(sock) == b""
        assert time.monotonic() - start <= KEEPALIVE_TIMEOUT + 1.5


def test_a_half_sent_request_line_gets_408(edge: RillProcess) -> None:
    with connect(edge.port) as sock:
        start = time.monotonic()
        assert send(sock, b"GET /hea")
        reply = answer(sock)
        assert HEADER_TIMEOUT - 0.2 <= time.monotonic() - start <= HEADER_TIMEOUT + 1.5
    assert_error(reply, 408, "request_timeout")


def test_headers_at_a_byte_a_second_get_408(edge: RillProcess) -> None:
    with connect(edge.port) as sock:
        elapsed = drip(sock, b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: abcdefghijklmnop\r\n\r\n", 1.0)
        assert_error(answer(sock), 408, "request_timeout")
    assert HEADER_TIMEOUT - 0.2 <= elapsed <= HEADER_TIMEOUT + 1.5


def test_a_body_at_a_byte_a_second_is_cut_and_nothing_is_stored(edge: RillProcess) -> None:
    url = "/v1/stream/slow-body"
    with httpx.Client(base_url=edge.url, timeout=10) as client:
        assert client.put(url, headers={"content-type": "text/plain"}).status_code == 201
        with connect(edge.port) as sock:
            head = f"POST {url} HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: 64\r\n\r\n"
            assert send(sock, head.encode())
            elapsed = drip(sock, b"x" * 64, 1.0)
            assert_error(answer(sock), 408, "request_timeout")
        assert elapsed <= 4.0
        assert client.get(url, params={"offset": "-1"}).content == b""


def _append(url: str, data: bytes) -> None:
    httpx.post(url, content=data, headers={"content-type": "text/plain"}, timeout=10)


def test_a_long_poll_outlives_every_edge_timer(edge: RillProcess) -> None:
    url = "/v1/stream/long-poll"
    with httpx.Client(base_url=edge.url, timeout=10) as client:
        assert client.put(url, headers={"content-type": "text/plain"}).status_code == 201
        # Data arrives after the header, body and keep-alive timeouts have all passed.
        later = threading.Timer(2.5, _append, (edge.url + url, b"late"))
        later.start()
        try:
            start = time.monotonic()
            reply = client.get(url, params={"offset": "-1", "live": "long-poll"})
            assert time.monotonic() - start >= 2.4
        finally:
            later.join()
    assert reply.status_code == 200
    assert reply.content == b"late"


def test_a_long_poll_ends_when_its_client_leaves(edge: RillProcess) -> None:
    """Nothing watched a waiting long-poll's connection: one client could open and drop hundreds,
    each held until the long-poll timeout, past every connection limit."""
    url = "/v1/stream/long-poll-orphans"
    assert httpx.put(edge.url + url, headers={"content-type": "text/plain"}).status_code == 201
    for _ in range(50):
        with socket.create_connection(("127.0.0.1", edge.port)) as sock:
            sock.sendall(b"GET %s?offset=now&live=long-poll HTTP/1.1\r\nHost: x\r\n\r\n" % url.encode())
            time.sleep(0.005)
    deadline = time.monotonic() + 2.0  # well inside the long-poll timeout (4 s)
    while (live := _live_long_polls(edge)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert live == 0


def _live_long_polls(edge: RillProcess) -> float:
    for line in httpx.get(edge.url + "/metrics").text.splitlines():
        if line.startswith('rill_live_subscribers{mode="long_poll"}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0
