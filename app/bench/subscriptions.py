"""`rill bench subscriptions`: what many subscriptions cost a 3-node cluster.

Starts three nodes on 127.0.0.1 (auth on), makes `streams` streams in groups of ten, and measures
on the leader, in one run: idle CPU and append latency (a fixed rate of appends to random streams)
without subscriptions and with `subscriptions` pull-wake subscriptions, each over one group, in
alternating phases (they are made and deleted between), pooling each side's latencies; once, the
time from an append to its wake event and what 10,000 acks with made-up lease tokens add to the
Raft log (they must add nothing). Segments are not sealed during the run (tiering would add
entries of its own).
"""

from __future__ import annotations

import asyncio
import os
import random
import secrets
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from app.bench.servers import cpu_seconds, free_port
from app.bench.stats import client_cpu, latency_summary
from app.security.tokens import new_token, toml_entry

BUCKET = "bench-subs"
GROUP = 10  # streams per subscription
JSON = {"content-type": "application/json"}


@dataclass
class SubscriptionOptions:
    subscriptions: int = 1000
    streams: int = 10_000
    rate: int = 200  # appends per second while latency is measured
    seconds: float = 15.0  # of appends, each phase
    idle_seconds: float = 5.0  # each phase
    rounds: int = 2  # phases with subscriptions, each between two without
    junk_acks: int = 10_000


def _start_cluster(tmp: Path) -> tuple[list[subprocess.Popen[bytes]], list[str], str]:
    ports = [free_port() for _ in range(3)]
    peers = ",".join(f"{n + 1}=http://127.0.0.1:{port}" for n, port in enumerate(ports))
    (tmp / "secret").write_text(secrets.token_hex(32))
    token = new_token()
    (tmp / "rill.toml").write_text('[auth]\nmode = "on"\n\n' + toml_entry(token, ["admin:*"], "bench"))
    processes = []
    for n, port in enumerate(ports, 1):
        cmd = [sys.executable, "-m", "app.cli", "serve", "--port", str(port), "--data-dir", str(tmp / f"n{n}")]
        cmd += ["--node-id", str(n), "--peers", peers, "--cluster-secret-file", str(tmp / "secret")]
        cmd += ["--config", str(tmp / "rill.toml"), "--cold-store", (tmp / "cold").as_uri()]
        log = (tmp / f"n{n}.log").open("wb")  # read it if a node dies under the load
        # Segments are not sealed during the run, so the log holds only what the workload writes.
        env = {**os.environ, "RILL_SEGMENT_MAX_AGE": "3600"}
        processes.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env))
    return processes, [f"http://127.0.0.1:{port}" for port in ports], token


def _leader(urls: list[str], token: str, timeout: float = 60) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for i, url in enumerate(urls):
            try:
                health = httpx.get(f"{url}/healthz", headers={"authorization": f"Bearer {token}"}, timeout=1).json()
            except (httpx.HTTPError, ValueError):
                continue
            if health.get("role") == "leader":
                return i
        time.sleep(0.2)
    raise RuntimeError("no leader")


async def _send(client: httpx.AsyncClient, method: str, url: str, **kwargs: Any) -> httpx.Response:
    """One idempotent request, sent again if a kept-alive connection was closed under it."""
    for attempt in range(5):
        try:
            response = await client.request(method, url, **kwargs)
        except httpx.TransportError:
            if attempt == 4:
                raise
            await asyncio.sleep(0.2)
            continue
        if response.status_code != 503:
            return response.raise_for_status()
        await asyncio.sleep(0.5)
    raise RuntimeError(f"{method} {url}: 503 five times")


async def _each(items: list[Any], worker: Any, concurrency: int = 32) -> None:
    queue = list(reversed(items))

    async def run() -> None:
        while queue:
            await worker(queue.pop())

    await asyncio.gather(*(run() for _ in range(concurrency)))


async def _appends(client: httpx.AsyncClient, base: str, options: SubscriptionOptions) -> tuple[list[float], float]:
    """Appends at a fixed rate to random streams: the latency of each, and the generator's CPU."""
    rng = random.Random(7)
    latencies: list[float] = []
    tasks = []

    async def one(stream: str) -> None:
        started = time.perf_counter()
        response = await client.post(f"{base}/{stream}", headers=JSON, content=b'{"n":1}')
        response.raise_for_status()
        latencies.append(time.perf_counter() - started)

    started, cpu = time.monotonic(), client_cpu()
    for i in range(int(options.rate * options.seconds)):
        await asyncio.sleep(max(0.0, started + i / options.rate - time.monotonic()))
        tasks.append(asyncio.ensure_future(one(f"g{rng.randrange(options.streams // GROUP)}/{rng.randrange(GROUP)}")))
    await asyncio.gather(*tasks)
    return latencies, (client_cpu() - cpu) / (time.monotonic() - started)


async def _wake_latency(client: httpx.AsyncClient, base: str, samples: int = 20) -> dict[str, float]:
    """From an append's acknowledgement to the wake event on the wake stream, for fresh subscriptions."""
    latencies = []
    for i in range(samples):
        await client.put(f"{base}/lat/{i}/s", headers=JSON)
        await client.put(f"{base}/lat/{i}/wake", headers=JSON)
        body = {"type": "pull-wake", "pattern": f"lat/{i}/s", "wake_stream": f"lat/{i}/wake"}
        (await client.put(f"{base}/__ds/subscriptions/lat-{i}", json=body)).raise_for_status()
        start = (await client.head(f"{base}/lat/{i}/wake")).headers["stream-next-offset"]
        await client.post(f"{base}/lat/{i}/s", headers=JSON, content=b"1")
        acked = time.perf_counter()
        woken = await client.get(f"{base}/lat/{i}/wake", params={"offset": start, "live": "long-poll"})
        assert woken.status_code == 200, woken.status_code
        latencies.append(time.perf_counter() - acked)
    return latency_summary(latencies)


async def _junk_acks(client: httpx.AsyncClient, base: str, health: str, count: int) -> dict[str, int]:
    before = (await client.get(health)).json()["commit"]
    statuses: dict[int, int] = {}
    ack = {"wake_id": "w_0", "generation": 1, "acks": [], "done": True}

    async def one(i: int) -> None:
        url, headers = f"{base}/__ds/subscriptions/sub-{i % 100}/ack", {"authorization": f"Bearer junk{i}.x"}
        for _ in range(5):  # a refusal before the body is read closes the connection: the next may race it
            try:
                response = await client.post(url, json=ack, headers=headers)
                break
            except httpx.TransportError:
                await asyncio.sleep(0.05)
        else:
            raise RuntimeError("junk acks: the connection kept failing")
        statuses[response.status_code] = statuses.get(response.status_code, 0) + 1

    await _each(list(range(count)), one)
    after = (await client.get(health)).json()["commit"]
    return {"junk_acks": count, "answered_401": statuses.get(401, 0), "log_entries_added": after - before}


def _idle_cpu(pid: int, seconds: float) -> float:
    before = cpu_seconds(pid)
    time.sleep(seconds)
    return (cpu_seconds(pid) - before) / seconds


async def _setup(client: httpx.AsyncClient, leader: str, options: SubscriptionOptions) -> None:
    await _send(client, "PUT", f"{leader}/ds/{BUCKET}")
    base = f"{leader}/ds/{BUCKET}"
    names = [f"g{g}/{s}" for g in range(options.streams // GROUP) for s in range(GROUP)]
    names += [f"wake/{w}" for w in range(10)]

    async def create(name: str) -> None:
        await _send(client, "PUT", f"{base}/{name}", headers=JSON)

    await _each(names, create)


async def _subscribe(client: httpx.AsyncClient, base: str, options: SubscriptionOptions) -> None:
    async def create(i: int) -> None:
        body = {"type": "pull-wake", "pattern": f"g{i % (options.streams // GROUP)}/*", "wake_stream": f"wake/{i % 10}"}
        await _send(client, "PUT", f"{base}/__ds/subscriptions/sub-{i}", json=body)

    await _each(list(range(options.subscriptions)), create)


async def _unsubscribe(client: httpx.AsyncClient, base: str, options: SubscriptionOptions) -> None:
    async def delete(i: int) -> None:
        await _send(client, "DELETE", f"{base}/__ds/subscriptions/sub-{i}")

    await _each(list(range(options.subscriptions)), delete)


def run_subscriptions(options: SubscriptionOptions) -> dict[str, dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="rill-bench-subs-") as tmp:
        processes, urls, token = _start_cluster(Path(tmp))
        try:
            i = _leader(urls, token)
            leader, pid = urls[i], processes[i].pid
            base, health = f"{leader}/ds/{BUCKET}", f"{leader}/healthz"
            results: dict[str, dict[str, Any]] = {}

            async def phase(step: str) -> dict[str, Any]:
                headers = {"authorization": f"Bearer {token}"}
                limits = httpx.Limits(max_connections=64)
                async with httpx.AsyncClient(timeout=60, headers=headers, limits=limits) as client:
                    if step == "setup":
                        await _setup(client, leader, options)
                    elif step == "with":
                        await _subscribe(client, base, options)
                    else:
                        await _unsubscribe(client, base, options)
                    await asyncio.sleep(2)  # let the leader settle before measuring idle
                    idle = await asyncio.to_thread(_idle_cpu, pid, options.idle_seconds)
                    latencies, generator = await _appends(client, base, options)
                    row: dict[str, Any] = {"idle": [idle], "latencies": latencies, "generator": [generator]}
                    if step == "with" and not pooled.get("with subscriptions", {}).get("extra"):  # once
                        wake = await _wake_latency(client, base)
                        row["extra"] = {f"wake_{k}": v for k, v in wake.items()}
                        row["extra"] |= await _junk_acks(client, base, health, options.junk_acks)
                    return row

            # Phases alternate (without, with, without, ...) and each side's latencies are pooled:
            # a cluster on two cores drifts between phases as much as subscriptions could cost.
            pooled: dict[str, dict[str, Any]] = {}
            results["with subscriptions"] = {}  # first: the table's ratio column is with / without
            steps = ["setup"] + ["with", "without"] * options.rounds
            for step in steps:
                side = "with subscriptions" if step == "with" else "without"
                row = asyncio.run(phase(step))
                into = pooled.setdefault(side, {"idle": [], "latencies": [], "generator": [], "extra": {}})
                for key in ("idle", "latencies", "generator"):
                    into[key] += row[key]
                into["extra"] |= row.get("extra", {})
            for side, into in pooled.items():
                results[side] = {
                    "subscriptions": options.subscriptions if side != "without" else 0,
                    "streams": options.streams,
                    "phases": len(into["idle"]),
                    "idle_leader_cpu": max(into["idle"]),
                    "appends": len(into["latencies"]),
                    **latency_summary(into["latencies"]),
                    "generator_cpu": max(into["generator"]),
                    **into["extra"],
                }
            return results
        finally:
            for process in processes:
                process.terminate()
            for process in processes:
                process.wait(15)
