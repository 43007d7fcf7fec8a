"""Hostile and broken input, in-process: malformed request lines and headers get a JSON 400 and a
lingering close without reaching the app; oversized heads a 431 however they are sliced; garbage
after a request never passes for its answer; a request split byte by byte is the same request."""

from __future__ import annotations

import asyncio
import json

import pytest

from app.serving.limits import EdgeLimits
from tests.serving.harness import GET, FakeTransport, Recorder, connect, settle, statuses


def _exchange(chunks: list[bytes], limits: EdgeLimits | None = None) -> tuple[Recorder, FakeTransport]:
    async def run() -> tuple[Recorder, FakeTransport]:
        app = Recorder()
        connection, transport = connect(app, limits)
        for chunk in chunks:
            connection.data_received(chunk)
            await asyncio.sleep(0)
        await settle()
        connection.connection_lost(None)
        return app, transport

    return asyncio.run(run())


def _error(transport: FakeTransport, status: int, code: str) -> None:
    """One JSON error answer, then a half-close (the lingering close)."""
    assert statuses(transport.written) == [status], bytes(transport.written[:200])
    head, _, body = bytes(transport.written).partition(b"\r\n\r\n")
    assert b"\r\nconnection: close\r\n" in head and b"\r\ncontent-type: application/json\r\n" in head
    assert json.loads(body)["error"]["code"] == code
    assert transport.eof


@pytest.mark.parametrize(
    "request_line",
    [
        b"GET / HTTP/9.9\r\n\r\n",  # an unknown version
        b"FOO / HTTP/1.1\r\n\r\n",  # an unknown method
        b"GET /caf\xc3\xa9 HTTP/1.1\r\n\r\n",  # a raw non-ASCII target
        b"GET /a?b=\x7f HTTP/1.1\r\n\r\n",
        b"GET / HTTP/1.1\nHost: x\n\n",  # bare LF line ends
        b"GET / HTTP/1.1 extra\r\n\r\n",
        b"\x00\x01\x02\x03\r\n\r\n",
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",  # a TLS ClientHello on the plain port
        b"GET http://[::1/x HTTP/1.1\r\nHost: x\r\n\r\n",  # a target that is not a URL
    ],
)
def test_a_malformed_request_line_gets_a_400_and_never_reaches_the_app(request_line: bytes) -> None:
    app, transport = _exchange([request_line])
    _error(transport, 400, "bad_request")
    assert app.requests == []


@pytest.mark.parametrize(
    "header",
    [
        b"X-Folded: a\r\n b",  # obs-fold: a continuation line
        b"X-Nul: a\x00b",
        b"X-Cr: a\rb",
        b"X-Space : b",  # whitespace before the colon
        b"X Space: b",
        b"X-Del\x7f: b",
        b": no-name",
        b"no-colon",
        b"Content-Length: 1\r\nContent-Length: 2",  # two lengths: request smuggling
        b"Content-Length: -1",
        b"Content-Length: 1\r\nTransfer-Encoding: chunked",
    ],
)
def test_a_malformed_header_gets_a_400_and_never_reaches_the_app(header: bytes) -> None:
    app, transport = _exchange([b"POST / HTTP/1.1\r\nHost: x\r\n" + header + b"\r\n\r\n"])
    _error(transport, 400, "bad_request")
    assert app.requests == []


def test_an_unsupported_transfer_coding_gets_a_501() -> None:
    app, transport = _exchange([b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"])
    _error(transport, 501, "unsupported_transfer_coding")
    assert app.requests == []


LIMITS = EdgeLimits(max_header_bytes=1024)


@pytest.mark.parametrize("piece", [1, 7, 100, 4096, 1 << 20])
def test_a_huge_header_gets_a_431_however_it_is_sliced(piece: int) -> None:
    data = b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 4096 + b"\r\n\r\n"
    app, transport = _exchange([data[i : i + piece] for i in range(0, len(data), piece)], LIMITS)
    _error(transport, 431, "headers_too_large")
    assert app.requests == []


def test_an_endless_header_is_refused_before_much_is_read() -> None:
    async def run() -> int:
        connection, transport = connect(Recorder(), LIMITS)
        sent = 0
        connection.data_received(b"GET / HTTP/1.1\r\nX-Endless: ")
        while not transport.eof and sent < 1 << 20:
            connection.data_received(b"a" * 100)
            sent += 100
        _error(transport, 431, "headers_too_large")
        return sent

    assert asyncio.run(run()) <= 1024 + 100


def test_many_headers_over_the_limit_get_a_431() -> None:
    headers = b"".join(b"X-%d: v\r\n" % i for i in range(400))
    app, transport = _exchange([b"GET / HTTP/1.1\r\n" + headers + b"\r\n"], LIMITS)
    _error(transport, 431, "headers_too_large")


def test_a_head_just_under_the_limit_passes() -> None:
    head = b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 900 + b"\r\n\r\n"
    app, transport = _exchange([head], LIMITS)
    assert statuses(transport.written) == [200] and len(app.requests) == 1


def test_oversized_trailers_get_a_431() -> None:
    head = b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n0\r\n"
    trailers = b"".join(b"X-T-%d: %s\r\n" % (i, b"v" * 60) for i in range(40))
    app, transport = _exchange([head, trailers[:1500], trailers[1500:]], LIMITS)
    assert statuses(transport.written) == [431] and transport.eof


def test_garbage_pipelined_behind_a_request_never_passes_for_its_answer() -> None:
    # The request has not been answered when the garbage arrives: an error now would read as its
    # answer, so the connection is closed without one.
    app, transport = _exchange([GET + b"\x00garbage\r\n\r\n"])
    assert b"400" not in transport.written and transport.closed


def test_garbage_after_an_answered_request_gets_a_400() -> None:
    app, transport = _exchange([GET, b"\x00garbage\r\n\r\n"])
    assert statuses(transport.written) == [200, 400] and transport.eof


def test_a_request_after_a_malformed_one_is_not_parsed() -> None:
    app, transport = _exchange([b"GET / HTTP/1.1\r\nX-Nul: \x00\r\n\r\n" + GET, GET])
    _error(transport, 400, "bad_request")
    assert app.requests == []


@pytest.mark.parametrize("chunked", [False, True])
def test_a_request_split_byte_by_byte_is_the_same_request(chunked: bool) -> None:
    if chunked:
        framing, body = b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n", b"hello world"
    else:
        framing, body = b"Content-Length: 11\r\n\r\nhello world", b"hello world"
    data = b"POST /v1/stream/x?offset=-1 HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\n" + framing
    app, transport = _exchange(
        [data[i : i + 1] for i in range(len(data))] + [data[i : i + 1] for i in range(len(data))]
    )
    assert statuses(transport.written) == [200, 200]
    for scope, received in app.requests:
        assert (scope["path"], scope["query_string"], received) == ("/v1/stream/x", b"offset=-1", body)
        assert (b"content-type", b"text/plain") in scope["headers"]


def test_a_head_split_byte_by_byte_counts_against_the_limit_once() -> None:
    # 1,000 bytes of head a byte at a time stay under a 1,024-byte limit (no read counted twice).
    head = b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (1000 - 36) + b"\r\n\r\n"
    assert len(head) == 1000
    app, transport = _exchange([head[i : i + 1] for i in range(len(head))] * 3, LIMITS)
    assert statuses(transport.written) == [200, 200, 200]
