"""`rill cluster up` starts a working local cluster and stops every node when it is told to."""

from __future__ import annotations

import contextlib
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx


def _free_run(count: int) -> int:
    """A base port with `count` free ports after it."""
    for _ in range(50):
        base = random.randint(20_000, 40_000)
        try:
            sockets = [socket.create_server(("127.0.0.1", base + i)) for i in range(count)]
        except OSError:
            continue
        for s in sockets:
            s.close()
        return base
    raise RuntimeError("no free run of ports")


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_cluster_up_serves_and_stops_all_nodes_on_sigterm(tmp_path: Path) -> None:
    base = _free_run(3)
    cmd = [sys.executable, "-m", "app.cli", "cluster", "up", "--nodes", "3", "--base-port", str(base)]
    up = subprocess.Popen([*cmd, "--data-dir", str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            roles = []
            for port in range(base, base + 3):
                with contextlib.suppress(httpx.HTTPError):
                    roles.append(httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).json()["role"])
            if sorted(roles) == ["follower", "follower", "leader"]:
                break
            time.sleep(0.2)
        else:
            raise AssertionError(f"no working cluster: {roles}")
        with httpx.Client(follow_redirects=True, timeout=5) as client:
            url = f"http://127.0.0.1:{base + 1}/v1/stream/up"
            assert client.put(url, headers={"content-type": "text/plain"}).status_code == 201
        up.send_signal(signal.SIGTERM)
        assert up.wait(30) == 0
        assert not any(_listening(port) for port in range(base, base + 3))
    finally:
        if up.poll() is None:
            up.kill()
