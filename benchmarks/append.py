"""Append throughput of one durable node: `python -m benchmarks.append [--seconds N] [--data-dir DIR]`.

Starts `rill serve` pinned to one core, creates 100 streams, and drives
256-byte appends over 32 keep-alive connections with wrk pinned to the other
core. Prints appends/s and latency percentiles, the server's CPU per append,
and, measured in the same run: the data disk's fsync latency (no durable
append beats it) and the same load against bare uvicorn doing nothing
(`benchmarks/baseline.py`), the ceiling any Python server on this stack has.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from tests.server import free_port

LUA = """
local body = string.rep("x", {size})
request = function()
  local s = math.random(0, {streams} - 1)
  return wrk.format("POST", "/v1/stream/bench-" .. s, {{["Content-Type"] = "application/octet-stream"}}, body)
end
"""


def fsync_latency_ms(directory: Path, rounds: int = 200) -> tuple[float, float]:
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
    samples.sort()
    return statistics.median(samples), samples[int(len(samples) * 0.99) - 1]


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time a process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_load(url: str, args: argparse.Namespace, script: Path, server_pid: int, pin: bool) -> tuple[str, float]:
    """Runs wrk against `url`; returns its output and the server's CPU seconds meanwhile."""
    load = ["wrk", "-t1", f"-c{args.connections}", f"-d{args.seconds}s", "--latency", "-s", str(script), url]
    cpu_before = cpu_seconds(server_pid)
    out = subprocess.run((["taskset", "-c", "1"] if pin else []) + load, capture_output=True, text=True).stdout
    return out, cpu_seconds(server_pid) - cpu_before


def wait_healthy(url: str) -> None:
    for _ in range(200):
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.HTTPError:
            time.sleep(0.05)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--streams", type=int, default=100)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--data-dir", type=Path, help="where the node keeps its data (default: a temp dir)")
    parser.add_argument("--no-baseline", action="store_true", help="skip the bare-uvicorn run")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        sys.exit("wrk is not installed (Debian: apt-get install wrk)")
    cpus = os.cpu_count() or 1
    pin = cpus >= 2 and shutil.which("taskset") is not None

    with tempfile.TemporaryDirectory() as tmp:
        data_dir = args.data_dir or Path(tmp) / "data"
        data_dir.mkdir(parents=True, exist_ok=True)
        fsync_p50, fsync_p99 = fsync_latency_ms(data_dir)
        port = free_port()
        cmd = [sys.executable, "-m", "app.cli", "serve", "--port", str(port), "--data-dir", str(data_dir)]
        server = subprocess.Popen((["taskset", "-c", "0"] if pin else []) + cmd, stdout=subprocess.DEVNULL)
        try:
            url = f"http://127.0.0.1:{port}"
            wait_healthy(url + "/healthz")
            for i in range(args.streams):
                httpx.put(f"{url}/v1/stream/bench-{i}", headers={"content-type": "application/octet-stream"})
            script = Path(tmp) / "append.lua"
            script.write_text(LUA.format(size=args.size, streams=args.streams))
            out, server_cpu = run_load(url, args, script, server.pid, pin)
        finally:
            server.terminate()
            server.wait(10)
        baseline = None
        if not args.no_baseline:
            port = free_port()
            uvicorn = [sys.executable, "-m", "uvicorn", "benchmarks.baseline:app", "--port", str(port)]
            uvicorn += ["--loop", "uvloop", "--http", "httptools", "--no-access-log", "--log-level", "warning"]
            bare = subprocess.Popen((["taskset", "-c", "0"] if pin else []) + uvicorn, stdout=subprocess.DEVNULL)
            try:
                wait_healthy(f"http://127.0.0.1:{port}/")
                baseline_out, _ = run_load(f"http://127.0.0.1:{port}", args, script, bare.pid, pin)
                baseline = float(re.search(r"Requests/sec:\s+([\d.]+)", baseline_out).group(1))  # type: ignore[union-attr]
            finally:
                bare.terminate()
                bare.wait(10)

    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    total = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    print(f"machine: {cpus} cores, load {os.getloadavg()[0]:.2f}; server pinned to cpu 0, wrk to cpu 1: {pin}")
    print(f"disk fsync (fdatasync, 512 B): p50 {fsync_p50:.2f} ms, p99 {fsync_p99:.2f} ms")
    print(f"appends: {args.size} B to {args.streams} streams over {args.connections} connections, {args.seconds} s")
    print(f"throughput: {rate:,.0f} appends/s; errors: {errors.group(1) if errors else 0}")
    print(f"server CPU: {server_cpu / total * 1e6:.0f} us per append, {server_cpu / args.seconds:.0%} of one core")
    for pct in ("50%", "90%", "99%"):
        value = re.search(rf"{pct}\s+([\d.]+\w+)", out)
        print(f"latency p{pct[:-1]}: {value.group(1) if value else '?'}")
    if baseline:
        print(
            f"bare uvicorn, empty 204, same load: {baseline:,.0f} requests/s; Rill reaches {rate / baseline:.0%} of it"
        )


if __name__ == "__main__":
    main()
