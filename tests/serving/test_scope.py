"""The scope's addresses, scheme and request target, and how an access line shows a request."""

from __future__ import annotations

import socket
from typing import Any

import httptools
import pytest

from app.serving.scope import client_label, local_addr, path_with_query, remote_addr, request_target, scheme
from tests.serving.harness import FakeTransport


def test_addresses_from_the_transports_names() -> None:
    transport = FakeTransport()
    assert remote_addr(transport) == ("127.0.0.1", 50000)
    assert local_addr(transport) == ("127.0.0.1", 4437)
    assert scheme(transport) == "http"
    six = FakeTransport({"peername": ("::1", 50000, 0, 0), "sockname": ("::1", 4437, 0, 0)})
    assert remote_addr(six) is None  # a 4-tuple name without a socket: not guessed
    assert local_addr(six) == ("::1", 4437)
    unix = FakeTransport({"peername": "", "sockname": "/tmp/rill.sock"})
    assert remote_addr(unix) is None
    assert local_addr(unix) == ("/tmp/rill.sock", None)


def test_addresses_from_the_socket_first() -> None:
    with socket.socket(socket.AF_INET6) as listener:
        try:
            listener.bind(("::1", 0))
        except OSError:
            pytest.skip("no IPv6 loopback")
        listener.listen()
        with socket.create_connection(listener.getsockname()[:2]) as client:
            transport = FakeTransport({"socket": client})
            assert remote_addr(transport) == ("::1", listener.getsockname()[1])
            assert local_addr(transport) == ("::1", client.getsockname()[1])


def test_tls_is_https() -> None:
    assert scheme(FakeTransport({"sslcontext": object()})) == "https"


@pytest.mark.parametrize(
    ("target", "root", "expected"),
    [
        (b"/v1/stream/x", "", ("/v1/stream/x", b"/v1/stream/x", b"")),
        (b"/v1/stream/a%20b?offset=-1&live=sse", "", ("/v1/stream/a b", b"/v1/stream/a%20b", b"offset=-1&live=sse")),
        (b"/x?", "/api", ("/api/x", b"/api/x", b"")),
        (b"http://example.com/x?y=1", "", ("/x", b"/x", b"y=1")),
        (b"/%2F%00", "", ("//\x00", b"/%2F%00", b"")),  # decoded: the app sees what the client encoded
    ],
)
def test_the_request_target_is_split(target: bytes, root: str, expected: tuple[str, bytes, bytes]) -> None:
    assert request_target(target, root) == expected


def test_a_target_that_is_not_a_url_raises() -> None:
    with pytest.raises(httptools.HttpParserInvalidURLError):
        request_target(b"http://[::1/x", "")


def test_access_line_fields() -> None:
    scope: dict[str, Any] = {"client": ("10.0.0.1", 5123), "path": "/v1/stream/a b\n", "query_string": b"offset=-1"}
    assert client_label(scope) == "10.0.0.1:5123"
    assert path_with_query(scope) == "/v1/stream/a%20b%0A?offset=-1"  # no raw control character in a log line
    assert client_label({"client": None}) == ""
    assert path_with_query({"path": "/", "query_string": b""}) == "/"
