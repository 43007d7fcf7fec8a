"""The cluster a chaos run attacks: real `rill serve` processes on 127.0.0.1, each dialing every peer
through its own proxy link (`--peer-routes`), so the nemesis can cut, slow or reset any directed
link. Spare node ids have links from the start, for the joiners of membership faults. One node's
data directory can sit on a small tmpfs, for full-disk faults."""

from __future__ import annotations

import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from app.bench.chaos.proxy import ProxyHub
from app.security.tokens import toml_entry

DISK_BYTES = 192 * 1024 * 1024


@dataclass
class Member:
    id: int
    port: int
    data_dir: Path
    process: subprocess.Popen[bytes] | None = None
    paused: bool = False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None


class ChaosCluster:
    def __init__(
        self,
        root: Path,
        size: int,
        spares: int,
        hub: ProxyHub,
        disk_node: int | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.root, self.size, self.hub = root, size, hub
        self.extra_env = dict(env or {})  # a broken build's test switch goes here
        self.admin_token = "rill_chaos-" + secrets.token_hex(8)
        ids = range(1, size + spares + 1)
        # The nodes' ports stay bound until the proxies have theirs, so no proxy takes a node's port.
        held = [_bound() for _ in ids]
        self.members = {i: Member(i, sock.getsockname()[1], root / f"n{i}") for i, sock in zip(ids, held, strict=True)}
        self.voters = set(range(1, size + 1))
        try:
            self.links = {(a, b): hub.add((a, b), self.members[b].port) for a in ids for b in ids if a != b}
        finally:
            for sock in held:
                sock.close()
        (root / "secret").write_text(secrets.token_hex(32))
        # Short long-polls and SSE responses, so readers reconnect (to other nodes) often.
        (root / "chaos.toml").write_text(
            "long_poll_timeout = 2.0\nsse_max_seconds = 6.0\n" + toml_entry(self.admin_token, ["admin:*"], "chaos")
        )
        self.disk_node = disk_node
        self.disk_skipped = ""
        if disk_node is not None:
            self.disk_skipped = _mount_tmpfs(self.members[disk_node].data_dir)

    def peers(self, ids: set[int]) -> str:
        return ",".join(f"{i}={self.members[i].url}" for i in sorted(ids))

    def routes(self, node: int) -> str:
        return ",".join(f"{b}=http://127.0.0.1:{self.links[(node, b)]}" for b in self.members if b != node)

    def start(self, node: int, join: bool = False) -> None:
        m = self.members[node]
        cmd = [sys.executable, "-m", "app.cli", "serve", "--port", str(m.port), "--data-dir", str(m.data_dir)]
        cmd += ["--node-id", str(node), "--peers", self.peers(self.voters), "--peer-routes", self.routes(node)]
        cmd += ["--cluster-secret-file", str(self.root / "secret"), "--config", str(self.root / "chaos.toml")]
        cmd += ["--cold-store", (self.root / "cold").as_uri(), *(["--join"] if join else [])]
        env = {**os.environ, **self.extra_env}
        with (self.root / f"n{node}.log").open("ab") as log:
            m.process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        m.paused = False

    def wait_healthy(self, node: int, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.members[node].running:
                log = (self.root / f"n{node}.log").read_text(errors="replace").splitlines()
                raise RuntimeError(f"node {node} exited; its log ends:\n" + "\n".join(log[-15:]))
            if self.health(node):
                return
            time.sleep(0.1)
        raise RuntimeError(f"node {node} did not answer /healthz in {timeout:.0f} s")

    def health(self, node: int) -> dict[str, object]:
        m = self.members[node]
        if not m.running or m.paused:
            return {}
        try:
            found = httpx.get(f"{m.url}/healthz", timeout=2).json()
        except (httpx.HTTPError, ValueError):
            return {}
        return found if isinstance(found, dict) else {}

    def leader(self, timeout: float = 30) -> int:
        """The node every running voter agrees leads (they may disagree briefly after a fault)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            roles = {n: self.health(n) for n in self.voters}
            leaders = [n for n, h in roles.items() if h.get("role") == "leader"]
            if len(leaders) == 1:
                return leaders[0]
            time.sleep(0.2)
        raise RuntimeError(f"no leader in {timeout:.0f} s")

    def kill(self, node: int) -> None:
        m = self.members[node]
        if m.process is not None and m.running:
            if m.paused:
                m.process.send_signal(signal.SIGCONT)
            m.process.kill()
            m.process.wait()
        m.paused = False

    def pause(self, node: int) -> None:
        m = self.members[node]
        if m.process is not None and m.running:
            m.process.send_signal(signal.SIGSTOP)
            m.paused = True

    def resume(self, node: int) -> None:
        m = self.members[node]
        if m.process is not None and m.paused:
            m.process.send_signal(signal.SIGCONT)
        m.paused = False

    def change(self, method: str, path: str, body: dict[str, object] | None = None, timeout: float = 60) -> int:
        """A membership change sent to any running voter (followers forward it); its status, 0 if none answered."""
        headers = {"authorization": f"Bearer {self.admin_token}"}
        for node in sorted(self.voters):
            m = self.members[node]
            if not m.running or m.paused:
                continue
            try:
                r = httpx.request(method, f"{m.url}{path}", json=body, headers=headers, timeout=timeout)
            except httpx.HTTPError:
                continue
            return r.status_code
        return 0

    def stop(self) -> None:
        for m in self.members.values():
            self.kill(m.id)
        if self.disk_node is not None and not self.disk_skipped:
            subprocess.run(["umount", "-l", str(self.members[self.disk_node].data_dir)], check=False)

    def log_errors(self) -> list[str]:
        return log_errors(self.root)


_RECORD = re.compile(r"\d{4}-\d\d-\d\d ")  # a log record's first line starts with its date


def log_errors(root: Path, most: int = 400) -> list[str]:
    """Error records of the nodes' logs under `root`, each with its continuation lines (the task, the
    traceback down to its exception), up to the next record."""
    found: list[str] = []
    for log in sorted(root.glob("n*.log")):
        in_error = False
        for line in log.read_text(errors="replace").splitlines():
            if _RECORD.match(line):
                in_error = " ERROR " in line or "AssertionError" in line
            elif line.startswith("Traceback"):
                in_error = True
            if in_error:
                found.append(f"{log.stem}: {line}")
    return found[:most]


def _bound() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    return sock


def _mount_tmpfs(path: Path) -> str:
    """Mounts a DISK_BYTES tmpfs at `path`; "" on success, else why not (the disk faults are skipped)."""
    path.mkdir(parents=True, exist_ok=True)
    try:
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={DISK_BYTES}", "tmpfs", str(path)],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return f"cannot mount a tmpfs: {exc}"
    if done.returncode != 0:
        return f"cannot mount a tmpfs: {done.stderr.strip() or done.returncode}"
    return ""


def fill(path: Path, leave: int = 512 * 1024) -> int:
    """Fills the filesystem at `path` with a filler file until `leave` bytes are free; the bytes written."""
    stat = os.statvfs(path)
    free = stat.f_bavail * stat.f_frsize
    size = max(0, free - leave)
    with (path / "chaos-filler").open("wb") as fh:
        chunk = b"\0" * (1 << 20)
        written = 0
        try:
            while written < size:
                written += fh.write(chunk[: min(len(chunk), size - written)])
        except OSError:
            pass
    return written


def unfill(path: Path) -> None:
    (path / "chaos-filler").unlink(missing_ok=True)
