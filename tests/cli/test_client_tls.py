"""The data commands over HTTPS: `--tls-ca` names the CA, without it the failure is one line."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.cli.conftest import invoke
from tests.security.test_tls import Certificates, TLSProcess
from tests.server import free_port

Capture = pytest.CaptureFixture[bytes]


@pytest.fixture(scope="module")
def tls_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TLSProcess, Certificates]]:
    certs = Certificates(tmp_path_factory.mktemp("cli-certs"))
    node = TLSProcess(tmp_path_factory.mktemp("cli-tls") / "data", free_port(), certs).start()
    yield node, certs
    node.stop()


def test_https_with_the_ca(tls_node: tuple[TLSProcess, Certificates], capsysbinary: Capture) -> None:
    node, certs = tls_node
    args = ("--server", node.url, "--tls-ca", str(certs.ca))
    assert invoke(capsysbinary, "buckets", "create", "secure", *args)[0] == 0
    assert invoke(capsysbinary, "create", "secure/s", "--content-type", "text/plain", *args)[0] == 0
    assert invoke(capsysbinary, "append", "secure/s", "over tls", *args)[0] == 0
    assert invoke(capsysbinary, "read", "secure/s", *args)[1] == b"over tls"
    code, _, err = invoke(capsysbinary, "read", "secure/s", "--server", node.url)
    assert code == 1 and err == f"rill: error: cannot connect to {node.url}: {_UNTRUSTED}\n"


_UNTRUSTED = "its certificate is not trusted (--tls-ca names the CA that signed it)"
