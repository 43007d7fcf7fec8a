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
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from app.bench.append_wrk import check_wrk, run_wrk
from app.bench.memory_cluster import leader_first, start_cluster
from app.bench.run import Run
from app.bench.servers import Server, cpu_seconds, start_rill

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


def _start(mode: str, data: Path) -> list[Server]:
    """The servers of one mode, the leader first (auth off, started as the other benches start them)."""
    env = {"RILL_PEER_CHANNELS": "true" if mode == "channels" else "false"}
    if mode == "single":
        return [start_rill(data, env=env)]
    return leader_first(start_cluster(data, env=env))


def _pin(pid: int, cpu: int) -> None:
    """Every thread of the process, now and later, on `cpu`."""
    subprocess.run(["taskset", "-acp", str(cpu), str(pid)], stdout=subprocess.DEVNULL, check=True)


def _one(mode: str, opts: ReplicationOptions, tmp: Path) -> dict[str, Any]:
    data = Path(tempfile.mkdtemp(prefix=f"{mode}-", dir=tmp))
    servers: list[Server] = []
    try:
        servers = _start(mode, data)
        for i, server in enumerate(servers):
            _pin(server.process.pid, opts.others_cpu if i else opts.leader_cpu)
        targets = [f"{servers[0].url}/r{i}" for i in range(STREAMS)]
        with httpx.Client(timeout=10) as client:
            for url in targets:
                client.put(url, headers={"content-type": "application/octet-stream"}).raise_for_status()
        result, used = asyncio.run(_load(targets, [s.process.pid for s in servers], opts))
    finally:
        for server in servers:
            server.stop()
        shutil.rmtree(data, ignore_errors=True)
    ok, seconds = result["ok"], result["seconds"]
    leader, followers = used[0], used[1:]
    return {
        "per_second": result["per_second"],
        "p99_ms": result["p99_ms"],
        "leader_cpu_us_per_append": leader / ok * 1e6 if ok else float("nan"),
        "follower_cpu_us_per_append": statistics.mean(followers) / ok * 1e6 if ok and followers else float("nan"),
        "leader_core": leader / seconds,
        "client_cpu": result["client_cpu"],
        "errors": result["errors"],
    }


async def _load(targets: list[str], pids: list[int], opts: ReplicationOptions) -> tuple[dict[str, Any], list[float]]:
    """wrk's warm-up, then its measured run; its report, and each node's CPU seconds over the latter."""
    run, payload, octet = Run(targets), b"x" * opts.size, "application/octet-stream"
    await run_wrk(run, targets, payload, octet, opts.writers, 0, opts.warmup)
    before = [cpu_seconds(pid) for pid in pids]
    result = await run_wrk(run, targets, payload, octet, opts.writers, 0, opts.seconds)
    return result, [cpu_seconds(pid) - b for pid, b in zip(pids, before, strict=True)]


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
