"""`rill bench replication`: CPU per replicated append on 3 nodes, against one node, in alternating rounds.

Each round starts fresh servers for each mode in turn: `single` (one node), `http` (3 nodes sending
Raft messages as signed HTTP requests) and `channels` (3 nodes on framed peer channels). In a
cluster the leader runs alone on `leader_cpu` and the followers share `others_cpu` with wrk; one
node runs on `leader_cpu` with wrk on `others_cpu`. wrk posts `size`-byte appends to 100 streams on
the leader from `writers` connections: a warm-up, then `seconds` measured, over which each node's
CPU is read from /proc. The data lives in a temporary directory (on /dev/shm where there is one:
the disk's sync time is the same for every mode and only adds noise to a CPU figure).

Every figure is the median over rounds; the ratios to one node are the medians of each round's own
ratio, so a noisy round moves both sides of its ratio together.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from app.bench.append_wrk import check_wrk, run_wrk
from app.bench.run import Run
from app.bench.servers import cpu_seconds, free_port

MODES = ("channels", "single", "http")  # the first is the table's first column: its ratios to the others
STREAMS = 100


@dataclass
class ReplicationOptions:
    rounds: int = 4
    seconds: float = 10.0
    warmup: float = 3.0
    writers: int = 32
    size: int = 256
    leader_cpu: int = 0
    others_cpu: int = 1

    def check(self) -> None:
        check_wrk()
        if shutil.which("taskset") is None:
            raise SystemExit("rill bench replication pins each node to a CPU: it needs taskset (util-linux)")
        if self.rounds < 1:
            raise SystemExit("--rounds must be at least 1")


@dataclass
class _Nodes:
    processes: dict[int, subprocess.Popen[bytes]]
    urls: dict[int, str]

    def stop(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.terminate()
        for process in self.processes.values():
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _start(mode: str, data: Path) -> _Nodes:
    count = 1 if mode == "single" else 3
    ports = {n: free_port() for n in range(1, count + 1)}
    peers = ",".join(f"{n}=http://127.0.0.1:{port}" for n, port in ports.items())
    env = {**os.environ, "RILL_PEER_CHANNELS": "true" if mode == "channels" else "false"}
    secret = data / "secret"
    secret.write_text(secrets.token_hex(32))
    processes = {}
    for n, port in ports.items():
        cmd = [sys.executable, "-m", "app.cli", "serve", "--port", str(port), "--data-dir", str(data / f"node-{n}")]
        if count > 1:
            cmd += ["--node-id", str(n), "--peers", peers, "--cluster-secret-file", str(secret)]
        processes[n] = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return _Nodes(processes, {n: f"http://127.0.0.1:{port}" for n, port in ports.items()})


def _leader(nodes: _Nodes, timeout: float = 30.0) -> int:
    """The node that answers /healthz as leader (the only node of a single-node run)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for n, url in nodes.urls.items():
            if nodes.processes[n].poll() is not None:
                raise RuntimeError(f"node {n} exited with status {nodes.processes[n].returncode}")
            try:
                if httpx.get(url + "/healthz", timeout=1).json().get("role") in ("leader", None):
                    return n
            except (httpx.HTTPError, ValueError):
                pass
        time.sleep(0.1)
    raise RuntimeError(f"no leader within {timeout:.0f} s")


def _pin(pid: int, cpu: int) -> None:
    """Every thread of the process, now and later, on `cpu`."""
    subprocess.run(["taskset", "-acp", str(cpu), str(pid)], stdout=subprocess.DEVNULL, check=True)


def _one(mode: str, opts: ReplicationOptions, tmp: Path) -> dict[str, Any]:
    data = Path(tempfile.mkdtemp(prefix=f"{mode}-", dir=tmp))
    nodes = _start(mode, data)
    try:
        leader = _leader(nodes)
        for n, process in nodes.processes.items():
            _pin(process.pid, opts.leader_cpu if n == leader else opts.others_cpu)
        with httpx.Client(timeout=10) as client:
            for i in range(STREAMS):
                url = f"{nodes.urls[leader]}/v1/stream/r{i}"
                client.put(url, headers={"content-type": "application/octet-stream"}).raise_for_status()
        targets = [f"{nodes.urls[leader]}/v1/stream/r{i}" for i in range(STREAMS)]
        pids = {n: p.pid for n, p in nodes.processes.items()}
        result, used = asyncio.run(_load(targets, pids, opts))
    finally:
        nodes.stop()
        shutil.rmtree(data, ignore_errors=True)
    ok, seconds = result["ok"], result["seconds"]
    followers = [used[n] for n in used if n != leader]
    return {
        "per_second": result["per_second"],
        "p99_ms": result["p99_ms"],
        "leader_cpu_us_per_append": used[leader] / ok * 1e6 if ok else float("nan"),
        "follower_cpu_us_per_append": statistics.mean(followers) / ok * 1e6 if ok and followers else float("nan"),
        "leader_core": used[leader] / seconds,
        "client_cpu": result["client_cpu"],
        "errors": result["errors"],
    }


async def _load(
    targets: list[str], pids: dict[int, int], opts: ReplicationOptions
) -> tuple[dict[str, Any], dict[int, float]]:
    """wrk's warm-up, then its measured run; its report, and each node's CPU seconds over the latter."""
    run, payload, octet = Run(targets), b"x" * opts.size, "application/octet-stream"
    await run_wrk(run, targets, payload, octet, opts.writers, 0, opts.warmup)
    before = {n: cpu_seconds(pid) for n, pid in pids.items()}
    result = await run_wrk(run, targets, payload, octet, opts.writers, 0, opts.seconds)
    return result, {n: cpu_seconds(pid) - before[n] for n, pid in pids.items()}


def run_replication(opts: ReplicationOptions) -> dict[str, dict[str, Any]]:
    os.sched_setaffinity(0, {opts.others_cpu})  # this process and wrk, its child, beside the followers
    shm = Path("/dev/shm")
    rounds: list[dict[str, dict[str, Any]]] = []
    with tempfile.TemporaryDirectory(prefix="rill-bench-replication-", dir=shm if shm.is_dir() else None) as tmp:
        for number in range(1, opts.rounds + 1):
            measured = {mode: _one(mode, opts, Path(tmp)) for mode in ("single", "http", "channels")}
            rounds.append(measured)
            line = ", ".join(
                f"{mode} {m['per_second']:,.0f}/s leader {m['leader_cpu_us_per_append']:.0f} µs"
                for mode, m in measured.items()
            )
            print(f"round {number}: {line}", file=sys.stderr, flush=True)
    return _summarize(rounds)


def _summarize(rounds: list[dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    names = {"channels": "3 nodes, channels", "single": "1 node", "http": "3 nodes, HTTP"}
    results: dict[str, dict[str, Any]] = {}
    for mode in MODES:
        runs = [r[mode] for r in rounds]
        column: dict[str, Any] = {"rounds": len(runs)}
        for key in ("per_second", "p99_ms", "leader_cpu_us_per_append", "follower_cpu_us_per_append"):
            column[key] = statistics.median(run[key] for run in runs)
        column["leader_core"] = statistics.median(run["leader_core"] for run in runs)
        column["client_cpu"] = max(run["client_cpu"] for run in runs)  # the busiest the generator was
        errors: dict[str, int] = {}
        for run in runs:
            for name, count in run["errors"].items():
                errors[name] = errors.get(name, 0) + count
        column["errors"] = errors
        cpu = [r[mode]["leader_cpu_us_per_append"] / r["single"]["leader_cpu_us_per_append"] for r in rounds]
        rate = [r[mode]["per_second"] / r["single"]["per_second"] for r in rounds]
        column["leader_cpu_over_single"] = statistics.median(cpu)
        column["throughput_over_single"] = statistics.median(rate)
        column["leader_cpu_over_single_by_round"] = " ".join(f"{v:.2f}" for v in cpu)
        column["throughput_over_single_by_round"] = " ".join(f"{v:.2f}" for v in rate)
        results[names[mode]] = column
    return results
