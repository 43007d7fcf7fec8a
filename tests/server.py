"""Starts and stops real `rill serve` processes on 127.0.0.1 for tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from app.security.tokens import toml_entry


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RillProcess:
    def __init__(
        self,
        data_dir: Path,
        port: int | None = None,
        *extra: str,
        env: dict[str, str] | None = None,
        preexec_fn: Callable[[], None] | None = None,
    ) -> None:
        """`preexec_fn` runs in the child before exec, e.g. to set its resource limits."""
        self.data_dir = data_dir
        self.port = port or free_port()
        self.extra = list(extra)
        self.env = {**os.environ, **(env or {})}
        self.preexec_fn = preexec_fn
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = data_dir.parent / f"rill-{self.port}.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 20.0) -> RillProcess:
        cmd = [sys.executable, "-m", "app.cli", "serve", "--port", str(self.port), "--data-dir", str(self.data_dir)]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [*cmd, *self.extra], stdout=log, stderr=subprocess.STDOUT, env=self.env, preexec_fn=self.preexec_fn
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"rill exited with {self.proc.returncode}:\n{self.log_path.read_text()}")
            try:
                if httpx.get(self.url + "/healthz", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise RuntimeError("rill did not become healthy in time")

    def kill(self) -> None:
        """SIGKILL: no shutdown hooks, no flush."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def pause(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)  # a stopped process cannot handle SIGTERM
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


class RillCluster:
    """N `rill serve` processes forming one Raft group on 127.0.0.1.

    The nodes read the cluster secret from a file and a config (`--config`, before `extra`) that
    admits ADMIN_TOKEN (admin:*) and READ_TOKEN (read:*); auth stays off unless `extra` turns it on.
    """

    SECRET = "test-cluster-secret"
    ADMIN_TOKEN = "rill_test-admin-token"
    READ_TOKEN = "rill_test-read-token"

    def __init__(self, root: Path, size: int = 3, *extra: str, env: dict[str, str] | None = None) -> None:
        ports = [free_port() for _ in range(size)]
        self.peers = ",".join(f"{i + 1}=http://127.0.0.1:{port}" for i, port in enumerate(ports))
        self.env = env
        root.mkdir(parents=True, exist_ok=True)
        self.secret_file = root / "cluster-secret"
        self.secret_file.write_text(self.SECRET + "\n")
        self.secret_file.chmod(0o600)
        self.config = root / "cluster.toml"
        self.config.write_text(
            toml_entry(self.ADMIN_TOKEN, ["admin:*"], "test-admin")
            + toml_entry(self.READ_TOKEN, ["read:*"], "test-read")
        )
        self.nodes = {
            i + 1: RillProcess(
                root / f"node-{i + 1}",
                port,
                "--node-id",
                str(i + 1),
                "--peers",
                self.peers,
                "--cluster-secret-file",
                str(self.secret_file),
                "--config",
                str(self.config),
                *extra,
                env=env,
            )
            for i, port in enumerate(ports)
        }

    def start(self) -> RillCluster:
        for node in self.nodes.values():
            node.start()
        self.wait_for_leader()
        return self

    @property
    def admin(self) -> dict[str, str]:
        """Headers carrying the admin token."""
        return {"authorization": f"Bearer {self.ADMIN_TOKEN}"}

    def health(self, node_id: int) -> dict[str, object] | None:
        try:
            return httpx.get(self.nodes[node_id].url + "/healthz", headers=self.admin, timeout=1).json()
        except httpx.HTTPError:
            return None

    def wait_for_leader(self, timeout: float = 15.0) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for node_id, node in self.nodes.items():
                if node.proc and node.proc.poll() is None:
                    health = self.health(node_id)
                    if health and health["role"] == "leader":
                        return node_id
            time.sleep(0.05)
        raise RuntimeError("no leader was elected in time")

    def wait_converged(self, timeout: float = 15.0) -> None:
        """Every live node has applied the same index."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            applied = {h["applied"] for i in self.nodes if (h := self.health(i))}
            if len(applied) == 1:
                return
            time.sleep(0.05)
        raise RuntimeError("the nodes did not converge in time")

    def stop(self) -> None:
        for node in self.nodes.values():
            node.stop()


def read_to_tail(client: httpx.Client, url: str, offset: str = "-1") -> bytes:
    """Catch-up reads of the stream at `url` from `offset` until up to date, concatenated."""
    out = b""
    while True:
        response = client.get(url, params={"offset": offset})
        assert response.status_code == 200, response.text
        out += response.content
        offset = response.headers["stream-next-offset"]
        if response.headers.get("stream-up-to-date") == "true":
            return out
