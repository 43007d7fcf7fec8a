"""`fanout`: many SSE subscribers on one stream, one writer at a fixed rate; delivery latency and loss."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from app.bench.append import create_streams
from app.bench.run import Run
from app.bench.stats import client_cpu, latency_summary
from app.cluster.http1 import connect, encode_request, open_event_stream

JSON = "application/json"


@dataclass
class FanoutOptions:
    subscribers: int = 100
    rate: float = 100.0  # appends per second
    seconds: float = 10.0
    drain: float = 5.0  # how long subscribers may take to catch up after the writer stops


@dataclass
class Subscriber:
    received: dict[int, int] = field(default_factory=dict)  # seq -> times seen
    latencies: list[float] = field(default_factory=list)
    reconnects: int = 0
    ready: asyncio.Event = field(default_factory=asyncio.Event)


async def _subscribe(url: str, sub: Subscriber, done: asyncio.Event) -> None:
    offset = "now"
    while not done.is_set():
        stream = None
        try:
            stream = await open_event_stream(f"{url}?offset={offset}&live=sse")
            async for kind, data in stream.events():
                now = time.time()
                if kind == b"control":
                    control = json.loads(data)
                    offset = control.get("streamNextOffset", offset)
                    sub.ready.set()
                    if control.get("streamClosed"):
                        return
                elif kind == b"data":
                    for message in json.loads(data):
                        sub.received[message["seq"]] = sub.received.get(message["seq"], 0) + 1
                        sub.latencies.append(now - message["t"])
                if done.is_set():
                    return
        except (OSError, json.JSONDecodeError):
            await asyncio.sleep(0.1)
        finally:
            if stream is not None:
                stream.close()
        if not done.is_set():
            sub.reconnects += 1  # the server ends SSE responses now and then; resume where we were


async def run_fanout(run: Run, opts: FanoutOptions) -> dict[str, Any]:
    (url,) = await create_streams(run.urls[:1], [f"bench-fanout-{uuid.uuid4().hex[:8]}"], JSON)
    subs = [Subscriber() for _ in range(opts.subscribers)]
    done = asyncio.Event()
    readers = [asyncio.create_task(_subscribe(url, sub, done)) for sub in subs]
    await asyncio.wait_for(asyncio.gather(*(s.ready.wait() for s in subs)), 30)
    sent = 0
    loop = asyncio.get_running_loop()
    start = loop.time()

    async def write() -> None:
        nonlocal sent
        conn = await connect(url)
        try:
            while not run.stopped() and loop.time() - start < opts.seconds:
                body = json.dumps({"seq": sent, "t": time.time()}).encode()
                status, _ = await conn.request(encode_request("POST", url, {"Content-Type": JSON}, body))
                if status in (200, 204):
                    sent += 1
                await asyncio.sleep(max(start + sent / opts.rate - loop.time(), 0))
        finally:
            conn.close()

    cpu_start = client_cpu()
    writing = asyncio.create_task(write())
    await run.progress("fanout", opts.seconds, [writing])
    await writing
    drain_until = loop.time() + opts.drain
    while loop.time() < drain_until and any(len(s.received) < sent for s in subs):
        await asyncio.sleep(0.05)
    cpu = client_cpu() - cpu_start
    done.set()
    for task in readers:
        task.cancel()
    await asyncio.gather(*readers, return_exceptions=True)

    expected = sent * len(subs)
    delivered = sum(len(s.received) for s in subs)
    duplicates = sum(n - 1 for s in subs for n in s.received.values())
    result: dict[str, Any] = {
        "subscribers": len(subs),
        "sent": sent,
        "expected": expected,
        "delivered": delivered,
        "losses": expected - delivered,
        "duplicates": duplicates,
        "reconnects": sum(s.reconnects for s in subs),
        "sent_per_second": sent / opts.seconds,
        "client_cpu": cpu / (loop.time() - start),
    }
    result.update(latency_summary([lat for s in subs for lat in s.latencies]))
    return result
