"""`replay`: pre-filled streams read from the start to the tail by many clients at once."""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from dataclasses import dataclass
from typing import Any

import httpx

from app.bench.append import create_streams
from app.bench.client import connect, encode_request
from app.bench.run import Run
from app.bench.stats import client_cpu, latency_summary, rate


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
            status, body = await conn.request(raw)
            if status not in (200, 204):
                raise RuntimeError(f"filling {url}: {status} {body[:200]!r}")
    finally:
        conn.close()


async def _read_all(client: httpx.AsyncClient, url: str) -> tuple[float, int]:
    """Reads a stream from -1 until up to date; returns (seconds, bytes)."""
    start = time.perf_counter()
    offset, size = "-1", 0
    while True:
        r = await client.get(url, params={"offset": offset})
        r.raise_for_status()
        size += len(r.content)
        offset = r.headers["stream-next-offset"]
        if "stream-up-to-date" in r.headers:
            return time.perf_counter() - start, size


async def run_replay(run: Run, opts: ReplayOptions) -> dict[str, Any]:
    tag = uuid.uuid4().hex[:8]
    names = [f"bench-replay-{tag}-{i}" for i in range(opts.streams)]
    targets = await create_streams(run.urls, names, "application/octet-stream")
    payload = random.randbytes(opts.size)
    filling = [asyncio.create_task(_fill(url, opts.events, payload)) for url in targets]
    await run.progress("replay: fill", 600, filling)
    await asyncio.gather(*filling)

    limits = httpx.Limits(max_connections=opts.streams * opts.readers + 10)
    async with httpx.AsyncClient(limits=limits, timeout=60, follow_redirects=True) as client:
        start, cpu_start = time.perf_counter(), client_cpu()
        reads = [asyncio.create_task(_read_all(client, url)) for url in targets for _ in range(opts.readers)]
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
        "mb_per_second": rate(total, wall) / 1e6,
        "client_cpu": cpu / wall,
    }
    out.update({f"caught_up_{k}": v for k, v in latency_summary([t for t, _ in results]).items()})
    return out
