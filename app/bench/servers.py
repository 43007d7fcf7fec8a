"""Servers that `rill bench compare` starts: Rill, and the Node reference server (npm @durable-streams/server)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

REFERENCE_PACKAGE = "@durable-streams/server@0.3.7"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "rill-bench" / "reference"

# Starts the reference server in memory, or on disk when given a data dir; stops on SIGTERM.
REFERENCE_SCRIPT = """\
import { DurableStreamTestServer } from "@durable-streams/server"
const [port, dataDir] = process.argv.slice(2)
const server = new DurableStreamTestServer({ port: Number(port), host: "127.0.0.1", dataDir: dataDir || undefined })
await server.start()
process.on("SIGTERM", async () => { await server.stop(); process.exit(0) })
"""


@dataclass
class Server:
    name: str
    url: str  # stream prefix
    process: subprocess.Popen[bytes]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pinned(cmd: list[str], cpu: int | None) -> list[str]:
    return ["taskset", "-c", str(cpu), *cmd] if cpu is not None and shutil.which("taskset") else cmd


def _wait(process: subprocess.Popen[bytes], url: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with status {process.returncode}")
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.HTTPError:
            time.sleep(0.05)
    raise RuntimeError(f"server at {url} did not start in {timeout:.0f} s")


def start_rill(
    data_dir: Path, cpu: int | None = None, extra: list[str] | None = None, env: dict[str, str] | None = None
) -> Server:
    port = free_port()
    cmd = [sys.executable, "-m", "app.cli", "serve", "--port", str(port), "--data-dir", str(data_dir), *(extra or [])]
    process = subprocess.Popen(
        _pinned(cmd, cpu), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, **(env or {})}
    )
    _wait(process, f"http://127.0.0.1:{port}/healthz")
    return Server("rill", f"http://127.0.0.1:{port}/v1/stream", process)


def install_reference() -> Path:
    """Installs the reference server into a cache folder once; returns the script to run."""
    script = CACHE / "server.mjs"
    if not (CACHE / "node_modules" / "@durable-streams" / "server").exists():
        if shutil.which("npm") is None:
            raise RuntimeError("the reference server needs Node.js and npm")
        CACHE.mkdir(parents=True, exist_ok=True)
        (CACHE / "package.json").write_text('{"private": true, "type": "module"}\n')
        npm = ["npm", "install", "--no-audit", "--no-fund", "--loglevel=error", REFERENCE_PACKAGE]
        subprocess.run(npm, cwd=CACHE, check=True)
    script.write_text(REFERENCE_SCRIPT)
    return script


def start_baseline(cpu: int | None = None) -> Server:
    """Bare uvicorn answering every request with an empty 204: the ceiling of this HTTP stack."""
    port = free_port()
    cmd = [sys.executable, "-m", "uvicorn", "app.bench.baseline:app", "--port", str(port), "--loop", "uvloop"]
    cmd += ["--http", "httptools", "--no-access-log", "--log-level", "warning"]
    process = subprocess.Popen(_pinned(cmd, cpu), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait(process, f"http://127.0.0.1:{port}/")
    return Server("bare uvicorn (empty 204)", f"http://127.0.0.1:{port}/v1/stream", process)


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time a process has used so far (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def fsync_ms(directory: Path, rounds: int = 100) -> float:
    """Median fdatasync latency of 512-byte writes in `directory`: the floor of a durable append."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "fsync-probe"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    samples = []
    try:
        for _ in range(rounds):
            os.write(fd, b"x" * 512)
            start = time.perf_counter()
            os.fdatasync(fd)
            samples.append((time.perf_counter() - start) * 1000)
    finally:
        os.close(fd)
        path.unlink()
    return sorted(samples)[len(samples) // 2]


def start_reference(data_dir: Path | None, cpu: int | None = None) -> Server:
    script = install_reference()
    port = free_port()
    cmd = ["node", str(script), str(port), str(data_dir or "")]
    process = subprocess.Popen(_pinned(cmd, cpu), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=CACHE)
    _wait(process, f"http://127.0.0.1:{port}/v1/stream/_health")
    name = "reference (file)" if data_dir else "reference (memory)"
    return Server(name, f"http://127.0.0.1:{port}/v1/stream", process)
