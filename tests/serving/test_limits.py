"""Oversized headers, unknown transfer codings and garbage get JSON errors; normal uploads still work."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest

from tests.server import RillProcess, read_to_tail
from tests.serving.wire import answer, assert_error, connect, parse, read_to_close, send


def _peak_rss(server: RillProcess) -> int:
    assert server.proc is not None
    for line in Path(f"/proc/{server.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def test_garbage_gets_a_json_400(edge: RillProcess) -> None:
    with connect(edge.port) as sock:
        assert send(sock, b"\x16\x03\x01\x02\x00 not http at all\r\n\r\n")
        assert_error(answer(sock), 400, "bad_request")


def test_a_one_mib_header_gets_431(edge: RillProcess) -> None:
    with connect(edge.port) as sock:
        send(sock, b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (1 << 20) + b"\r\n\r\n")
        assert_error(answer(sock), 431, "headers_too_large")


def test_many_small_headers_over_the_limit_get_431(edge: RillProcess) -> None:
    headers = b"".join(b"X-H-%d: %s\r\n" % (i, b"v" * 30) for i in range(2000))  # ~80 KiB
    with connect(edge.port) as sock:
        send(sock, b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n")
        assert_error(answer(sock), 431, "headers_too_large")


def test_headers_under_the_limit_pass(edge: RillProcess) -> None:
    reply = httpx.get(edge.url + "/healthz", headers={"x-big": "a" * 60_000}, timeout=10)
    assert reply.status_code == 200


def test_a_huge_header_is_not_buffered(edge: RillProcess) -> None:
    before = _peak_rss(edge)
    for _ in range(2):
        with connect(edge.port) as sock:
            send(sock, b"GET /healthz HTTP/1.1\r\nX-Big: " + b"a" * (48 << 20))
            raw = read_to_close(sock)
        if raw:  # it may have been reset while still sending: the size limit is what is checked
            assert parse(raw).status == 431
    assert _peak_rss(edge) - before < 16 << 20
    assert httpx.get(edge.url + "/healthz", timeout=10).status_code == 200


@pytest.mark.parametrize(
    ("coding", "status", "code"),
    [
        ("gzip, chunked", 501, "unsupported_transfer_coding"),
        ("GZIP", 501, "unsupported_transfer_coding"),
        ("identity", 501, "unsupported_transfer_coding"),
        ("chunked, chunked", 400, "bad_request"),  # chunked twice: malformed, the parser refuses it
    ],
)
def test_an_unknown_transfer_coding_is_refused_and_stores_nothing(
    edge: RillProcess, coding: str, status: int, code: str
) -> None:
    url = f"/v1/stream/coding-{coding.replace(', ', '-')}"
    with httpx.Client(base_url=edge.url, timeout=10) as client:
        assert client.put(url, headers={"content-type": "text/plain"}).status_code == 201
        assert client.post(url, content=b"before", headers={"content-type": "text/plain"}).status_code == 204
        with connect(edge.port) as sock:
            head = f"POST {url} HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nTransfer-Encoding: {coding}\r\n\r\n"
            send(sock, head.encode() + b"5\r\nhello\r\n0\r\n\r\n")
            assert_error(answer(sock), status, code)
        assert client.get(url, params={"offset": "-1"}).content == b"before"


def test_a_chunked_upload_still_works(edge: RillProcess) -> None:
    url = "/v1/stream/chunked"
    pieces = [os.urandom(64 * 1024) for _ in range(16)]
    with httpx.Client(base_url=edge.url, timeout=30) as client:
        assert client.put(url, headers={"content-type": "application/octet-stream"}).status_code == 201
        reply = client.post(url, content=iter(pieces), headers={"content-type": "application/octet-stream"})
        assert reply.status_code == 204
        assert read_to_tail(client, url) == b"".join(pieces)


def test_a_large_upload_at_normal_speed_works(edge: RillProcess) -> None:
    url = "/v1/stream/large"
    body = os.urandom(8 << 20)
    with httpx.Client(base_url=edge.url, timeout=30) as client:
        assert client.put(url, headers={"content-type": "application/octet-stream"}).status_code == 201
        assert client.post(url, content=body, headers={"content-type": "application/octet-stream"}).status_code == 204
        assert read_to_tail(client, url) == body


def _edge_refusals(server: RillProcess, status: int) -> float:
    metrics = httpx.get(server.url + "/metrics", timeout=10).text
    line = f'rill_http_requests_total{{family="edge",method="other",status="{status}"}} '
    return next((float(row.removeprefix(line)) for row in metrics.splitlines() if row.startswith(line)), 0.0)


def test_what_the_edge_refuses_before_any_route_is_counted(edge: RillProcess) -> None:
    before = {status: _edge_refusals(edge, status) for status in (400, 431)}
    test_garbage_gets_a_json_400(edge)
    test_a_one_mib_header_gets_431(edge)
    assert {status: _edge_refusals(edge, status) for status in (400, 431)} == {
        400: before[400] + 1,
        431: before[431] + 1,
    }
