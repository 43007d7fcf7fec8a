"""The 3-node cluster `rill bench memory --follower` measures: nodes on 127.0.0.1 with auth off,
one cold store shared by all (as in production, where tiering reads what the leader uploads)."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

import httpx

from app.bench.servers import Server, free_port

NODES = 3


def start_cluster(
    tmp: Path, cpu: int | None = None, extra: list[str] | None = None, env: dict[str, str] | None = None
) -> list[Server]:
    """NODES `rill serve` processes forming one Raft group, each answering /healthz; node 1 first."""
    ports = [free_port() for _ in range(NODES)]
    peers = ",".join(f"{n}=http://127.0.0.1:{port}" for n, port in enumerate(ports, 1))
    secret = tmp / "secret"
    secret.write_text(secrets.token_hex(32))
    servers = []
    for n, port in enumerate(ports, 1):
        cmd = [sys.executable, "-m", "app.cli", "serve", "--port", str(port), "--data-dir", str(tmp / f"n{n}")]
        cmd += ["--node-id", str(n), "--peers", peers, "--cluster-secret-file", str(secret)]
        cmd += ["--cold-store", (tmp / "cold").as_uri(), *(extra or [])]
        if cpu is not None:
            cmd = ["taskset", "-c", str(cpu), *cmd]
        with (tmp / f"n{n}.log").open("wb") as log:  # read it if a node dies
            process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
        servers.append(Server(f"node {n}", f"http://127.0.0.1:{port}/v1/stream", process))
    try:
        for server in servers:
            _wait_healthy(server)
    except RuntimeError:
        for server in servers:
            server.stop()
        raise
    return servers


def leader_first(servers: list[Server], timeout: float = 60) -> list[Server]:
    """`servers` reordered with the leader first, once one is elected and the others know it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        health = [_health(base(s)) for s in servers]
        leaders = [i for i, h in enumerate(health) if h.get("role") == "leader"]
        if len(leaders) == 1 and all(h.get("leader") for h in health):
            i = leaders[0]
            return [servers[i], *servers[:i], *servers[i + 1 :]]
        time.sleep(0.2)
    for server in servers:
        server.stop()
    raise RuntimeError(f"no leader in {timeout:.0f} s")


def applied_everywhere(bases: list[str], timeout: float = 300) -> str:
    """Waits until every node has applied all the first one (the leader) had committed; "" once they
    have, else what went wrong."""
    commit = _health(bases[0]).get("commit")
    if not isinstance(commit, int):
        return "the leader did not report its commit index"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        applied = [_health(b).get("applied") for b in bases]
        if all(isinstance(a, int) and a >= commit for a in applied):
            return ""
        time.sleep(0.1)
    return f"the followers did not apply index {commit} in {timeout:.0f} s"


def log_errors(tmp: Path, most: int = 20) -> list[str]:
    """The nodes' logged errors and tracebacks (`node N: line`), at most `most` lines of them."""
    found: list[str] = []
    for log in sorted(tmp.glob("n*.log")):
        lines = log.read_text(errors="replace").splitlines()
        at = next((i for i, line in enumerate(lines) if " ERROR " in line or line.startswith("Traceback")), None)
        found += [] if at is None else [f"{log.stem}: {line}" for line in lines[at : at + most]]
    return found[:most]


def base(server: Server) -> str:
    return server.url.removesuffix("/v1/stream")


def _health(url: str) -> dict[str, object]:
    try:
        found = httpx.get(f"{url}/healthz", timeout=5).json()
    except (httpx.HTTPError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def _wait_healthy(server: Server, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"{server.name} exited with status {server.process.returncode}")
        if _health(base(server)):
            return
        time.sleep(0.05)
    raise RuntimeError(f"{server.name} did not answer /healthz in {timeout:.0f} s")
