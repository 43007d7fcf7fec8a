"""`append`: closed-loop writers appending fixed-size payloads to random streams."""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from dataclasses import dataclass
from typing import Any

import httpx

from app.bench.append_wrk import check_wrk, run_wrk, wrk_base
from app.bench.run import Run
from app.bench.stats import Recorder, client_cpu
from app.cluster.peer_client import PeerClientError, connect, encode_request


@dataclass
class AppendOptions:
    streams: int = 100
    writers: int = 32
    size: int = 256
    seconds: float = 10.0
    warmup: float = 2.0
    content_type: str = "application/octet-stream"
    producers: bool = False
    generator: str = "python"  # "python" (asyncio in this process) or "wrk" (C: the client is not the limit)

    def check(self) -> None:
        """Fails in one line before any server work when the options cannot run here."""
        if self.generator not in ("python", "wrk"):
            raise SystemExit(f"--generator must be python or wrk, not {self.generator!r}")
        if self.generator == "wrk":
            if self.producers:
                raise SystemExit("--producers needs --generator python (wrk sends no Producer-Seq headers)")
            check_wrk()


def make_payload(size: int, content_type: str) -> bytes:
    if "json" in content_type:
        return b'"' + b"x" * max(size - 2, 0) + b'"'  # one JSON string message
    if content_type.startswith("text/"):
        return b"x" * size
    return random.randbytes(size)


async def create_streams(urls: list[str], names: list[str], content_type: str) -> list[str]:
    """Creates the streams round-robin over the servers; returns their URLs."""
    stream_urls = [f"{urls[i % len(urls)]}/{name}" for i, name in enumerate(names)]
    async with httpx.AsyncClient(timeout=30, follow_redirects=True) as client:
        for url in stream_urls:
            r = await client.put(url, headers={"content-type": content_type})
            if r.status_code not in (200, 201):
                raise RuntimeError(f"creating {url} failed: {r.status_code} {r.text[:200]}")
    return stream_urls


async def run_append(run: Run, opts: AppendOptions) -> dict[str, Any]:
    opts.check()
    if opts.generator == "wrk":
        wrk_base(run.urls)  # one server only: fail before creating streams
    tag = uuid.uuid4().hex[:8]
    names = [f"bench-append-{tag}-{i}" for i in range(opts.streams)]
    targets = await create_streams(run.urls, names, opts.content_type)
    payload = make_payload(opts.size, opts.content_type)
    if opts.generator == "wrk":
        return await run_wrk(run, targets, payload, opts.content_type, opts.writers, opts.warmup, opts.seconds)
    plain = [encode_request("POST", url, {"Content-Type": opts.content_type}, payload) for url in targets]

    loop = asyncio.get_running_loop()
    start = loop.time()
    measure_from = start + opts.warmup
    deadline = measure_from + opts.seconds
    recorders = [Recorder() for _ in range(opts.writers)]
    cpu_at_measure: list[float] = []
    requests = [0]  # all requests, warm-up included

    async def writer(w: int) -> None:
        conn = await connect(targets[w % len(targets)])
        rec = recorders[w]
        seqs = [0] * len(targets)
        producer = f"bench-{tag}-{w}"
        try:
            while not run.stopped():
                now = loop.time()
                if now >= deadline:
                    return
                i = random.randrange(len(targets))
                if opts.producers:
                    headers = {
                        "Content-Type": opts.content_type,
                        "Producer-Id": producer,
                        "Producer-Epoch": "0",
                        "Producer-Seq": str(seqs[i]),
                    }
                    raw = encode_request("POST", targets[i], headers, payload)
                else:
                    raw = plain[i]
                t0 = time.perf_counter()
                status = (await conn.request(raw)).status
                latency = time.perf_counter() - t0
                if opts.producers and status == 200:
                    seqs[i] += 1
                requests[0] += 1
                if now >= measure_from:
                    rec.add(latency, status, len(payload))
        except (PeerClientError, TimeoutError):
            rec.statuses[0] += 1  # 0: the connection failed (the server closed it, or did not answer)
        finally:
            conn.close()

    async def mark_measurement() -> None:
        await asyncio.sleep(max(measure_from - loop.time(), 0))
        cpu_at_measure.append(client_cpu())

    tasks = [asyncio.create_task(writer(w)) for w in range(opts.writers)]
    marker = asyncio.create_task(mark_measurement())
    await run.progress("append", opts.warmup + opts.seconds, tasks)
    marker.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    elapsed = max(min(loop.time(), deadline) - measure_from, 1e-9)
    total = Recorder()
    for rec in recorders:
        total.merge(rec)
    summary = total.summary(elapsed)
    cpu_used = client_cpu() - (cpu_at_measure[0] if cpu_at_measure else client_cpu())
    summary["seconds"] = elapsed
    summary["client_cpu"] = cpu_used / elapsed  # share of one core the load generator used
    summary["_requests_total"] = requests[0]
    return summary
