"""Starts and stops real `rill serve` processes on 127.0.0.1 for tests."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RillProcess:
    def __init__(self, data_dir: Path, port: int | None = None, *extra: str) -> None:
        self.data_dir = data_dir
        self.port = port or free_port()
        self.extra = list(extra)
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = data_dir.parent / f"rill-{self.port}.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 20.0) -> RillProcess:
        cmd = [sys.executable, "-m", "app.cli", "serve", "--port", str(self.port), "--data-dir", str(self.data_dir)]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen([*cmd, *self.extra], stdout=log, stderr=subprocess.STDOUT)
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

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
