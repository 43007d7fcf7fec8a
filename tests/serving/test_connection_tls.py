"""Over TLS the same protocol class serves: normal requests, and its JSON errors and timeouts."""

from __future__ import annotations

import socket
import ssl
from collections.abc import Iterator

import httpx
import pytest

from tests.security.test_tls import Certificates, TLSProcess
from tests.server import free_port
from tests.serving.conftest import EDGE_CONFIG
from tests.serving.wire import assert_error, parse, read_to_close


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TLSProcess, ssl.SSLContext]]:
    root = tmp_path_factory.mktemp("edge-tls")
    certs = Certificates(root)
    config = root / "edge.toml"
    config.write_text(EDGE_CONFIG)
    server = TLSProcess(root / "data", free_port(), certs, "--config", str(config)).start()
    yield server, certs.context()
    server.stop()


def _exchange(tls: tuple[TLSProcess, ssl.SSLContext], data: bytes) -> bytes:
    server, context = tls
    with (
        socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as sock,
    ):
        sock.sendall(data)
        return read_to_close(sock)


def test_https_requests_are_served(tls: tuple[TLSProcess, ssl.SSLContext]) -> None:
    server, context = tls
    assert httpx.get(server.url + "/healthz", verify=context, timeout=10).status_code == 200


def test_a_half_sent_request_over_tls_gets_408(tls: tuple[TLSProcess, ssl.SSLContext]) -> None:
    assert_error(parse(_exchange(tls, b"GET /hea")), 408, "request_timeout")


def test_garbage_over_tls_gets_a_json_400(tls: tuple[TLSProcess, ssl.SSLContext]) -> None:
    assert_error(parse(_exchange(tls, b"nonsense\r\n\r\n")), 400, "bad_request")
