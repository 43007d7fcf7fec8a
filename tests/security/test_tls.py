"""TLS: `rill serve --tls-cert --tls-key` serves HTTPS, and nodes speak TLS to https:// peers,
verified against `--tls-ca` (Raft traffic, checkpoints and forwarded writes alike)."""

from __future__ import annotations

import asyncio
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trustme

from app.cluster.peer_client import client_context, connect, encode_request
from tests.server import RillProcess, free_port


class Certificates:
    def __init__(self, root: Path) -> None:
        ca = trustme.CA()
        issued = ca.issue_cert("127.0.0.1", "localhost")
        self.ca, self.cert, self.key = root / "ca.pem", root / "cert.pem", root / "key.pem"
        ca.cert_pem.write_to_path(str(self.ca))
        for i, pem in enumerate(issued.cert_chain_pems):
            pem.write_to_path(str(self.cert), append=i > 0)
        issued.private_key_pem.write_to_path(str(self.key))

    def context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca))

    def serve(self) -> list[str]:
        return ["--tls-cert", str(self.cert), "--tls-key", str(self.key)]


class TLSProcess(RillProcess):
    """A node serving HTTPS; its health is checked against the test CA."""

    def __init__(self, data_dir: Path, port: int, certs: Certificates, *extra: str) -> None:
        super().__init__(data_dir, port, *certs.serve(), *extra)
        self.certs = certs

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def health(self) -> dict[str, Any] | None:
        try:
            return dict(httpx.get(self.url + "/healthz", verify=self.certs.context(), timeout=1).json())
        except (httpx.HTTPError, ValueError):
            return None

    def start(self, timeout: float = 20.0) -> TLSProcess:
        cmd = [sys.executable, "-m", "app.cli", "serve", "--port", str(self.port), "--data-dir", str(self.data_dir)]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen([*cmd, *self.extra], stdout=log, stderr=subprocess.STDOUT, env=self.env)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"rill exited with {self.proc.returncode}:\n{self.log_path.read_text()}")
            if self.health() is not None:
                return self
            time.sleep(0.05)
        raise RuntimeError("rill did not become healthy in time")


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return Certificates(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def node(certs: Certificates, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TLSProcess]:
    server = TLSProcess(tmp_path_factory.mktemp("tls") / "data", free_port(), certs).start()
    yield server
    server.stop()


def test_serve_answers_https_with_the_certificate(node: TLSProcess, certs: Certificates) -> None:
    with httpx.Client(base_url=node.url, verify=certs.context(), timeout=5) as client:
        assert client.put("/v1/stream/tls", headers={"content-type": "text/plain"}).status_code == 201
        assert (
            client.post("/v1/stream/tls", headers={"content-type": "text/plain"}, content=b"secret").status_code == 204
        )
        assert client.get("/v1/stream/tls?offset=-1").content == b"secret"
    with pytest.raises(httpx.ConnectError):  # the test CA is no system CA
        httpx.get(node.url + "/healthz", timeout=5)
    with pytest.raises(httpx.HTTPError):  # no plain HTTP on the TLS port
        httpx.get(f"http://127.0.0.1:{node.port}/healthz", timeout=5)


def test_the_raw_client_speaks_tls_and_verifies_the_server(node: TLSProcess, certs: Certificates) -> None:
    async def get(tls: ssl.SSLContext | None) -> int:
        conn = await connect(node.url, tls)
        try:
            response = await conn.request(encode_request("GET", node.url + "/healthz", {}), 5)
            return response.status
        finally:
            conn.close()

    assert asyncio.run(get(client_context(certs.ca))) == 200
    with pytest.raises(ssl.SSLCertVerificationError):
        asyncio.run(get(None))  # the system's CAs do not know the test CA


def test_a_cluster_over_https_elects_replicates_and_forwards(certs: Certificates, tmp_path: Path) -> None:
    ports = [free_port() for _ in range(3)]
    peers = ",".join(f"{i + 1}=https://127.0.0.1:{port}" for i, port in enumerate(ports))
    secret = tmp_path / "secret"
    secret.write_text("tls-cluster-secret\n")
    nodes = {
        i + 1: TLSProcess(
            tmp_path / f"node-{i + 1}",
            port,
            certs,
            *("--node-id", str(i + 1), "--peers", peers, "--cluster-secret-file", str(secret)),
            *("--tls-ca", str(certs.ca), "--forward-writes", "--cold-store", (tmp_path / "cold").as_uri()),
        )
        for i, port in enumerate(ports)
    }
    assert all(n.url.startswith("https://") for n in nodes.values())
    try:
        for process in nodes.values():
            process.start()
        deadline = time.monotonic() + 20
        leader = None
        while leader is None and time.monotonic() < deadline:
            leader = next((i for i, n in nodes.items() if (h := n.health()) and h["role"] == "leader"), None)
            time.sleep(0.1)
        assert leader is not None, "no leader was elected over TLS"
        follower, other = (i for i in nodes if i != leader)
        with httpx.Client(verify=certs.context(), timeout=10) as client:
            url = "/v1/stream/over-tls"
            created = client.put(nodes[leader].url + url, headers={"content-type": "text/plain"})
            assert created.status_code == 201
            for i in range(5):
                # Through a follower: forwarded to the leader over TLS (no redirect).
                resp = client.post(
                    nodes[follower].url + url, headers={"content-type": "text/plain"}, content=b"%d;" % i
                )
                assert resp.status_code == 204, resp.text
            expected = b"0;1;2;3;4;"
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                applied = {h["applied"] for n in nodes.values() if (h := n.health())}
                if len(applied) == 1:
                    break
                time.sleep(0.05)
            for replica in (follower, other):
                assert client.get(nodes[replica].url + url + "?offset=-1").content == expected
    finally:
        for process in nodes.values():
            process.stop()
