"""`replay`: pre-filled streams read from the start to the tail by many clients at once."""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from dataclasses import dataclass
from typing import Any

from app.bench.append import create_streams
from app.bench.run import Run
from app.bench.stats import client_cpu, latency_summary, rate
from app.cluster.peer_client import connect, encode_request


@dataclass
class ReplayOptions:
    streams: int = 10
    events: int = 1000
    size: int = 1024
    readers: int = 10  # per stream


async def _fill(url: str, events: int, payload: bytes) -> None:
    conn = await connect(url)
    raw = encode_request("POST", url, {"Content-Type": "application/octet-stream"}, payload)
    try:
        for _ in range(events):
            response = await conn.request(raw)
            if response.status not in (200, 204):
                raise RuntimeError(f"filling {url}: {response.status} {response.body[:200]!r}")
    finally:
        conn.close()


async def _read_all(url: str) -> tuple[float, int]:
    """Reads a stream from -1 until up to date over one connection; returns (seconds, bytes)."""
    conn = await connect(url)
    start = time.perf_counter()
    offset, size = "-1", 0
    try:
        while True:
            response = await conn.request(encode_request("GET", f"{url}?offset={offset}", {}))
            if response.status != 200:
                raise RuntimeError(f"reading {url}: {response.status} {response.body[:200]!r}")
            size += len(response.body)
            offset = response.header("stream-next-offset") or offset
            if response.header("stream-up-to-date") is not None:
                return time.perf_counter() - start, size
    finally:
        conn.close()


async def run_replay(run: Run, opts: ReplayOptions) -> dict[str, Any]:
    tag = uuid.uuid4().hex[:8]
    names = [f"bench-replay-{tag}-{i}" for i in range(opts.streams)]
    targets = await create_streams(run.urls, names, "application/octet-stream")
    payload = random.randbytes(opts.size)
    filling = [asyncio.create_task(_fill(url, opts.events, payload)) for url in targets]
    await run.progress("replay: fill", 600, filling)
    await asyncio.gather(*filling)

    start, cpu_start = time.perf_counter(), client_cpu()
    reads = [asyncio.create_task(_read_all(url)) for url in targets for _ in range(opts.readers)]
    await run.progress("replay: read", 600, reads)
    results = await asyncio.gather(*reads)
    wall = time.perf_counter() - start
    cpu = client_cpu() - cpu_start

    total = sum(size for _, size in results)
    expected = opts.streams * opts.readers * opts.events * opts.size
    out: dict[str, Any] = {
        "clients": len(results),
        "bytes_read": total,
        "bytes_expected": expected,
        "complete": total == expected,
        "mb_per_second": rate(total, wall) / 1e6,
        "client_cpu": cpu / wall,
    }
    out.update({f"caught_up_{k}": v for k, v in latency_summary([t for t, _ in results]).items()})
    return out
