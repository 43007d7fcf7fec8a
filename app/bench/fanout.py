"""`fanout`: many SSE subscribers on one stream, one writer at a fixed rate; delivery latency and loss."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import httpx

from app.bench.append import create_streams
from app.bench.run import Run
from app.bench.stats import latency_summary


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


async def _subscribe(client: httpx.AsyncClient, url: str, sub: Subscriber, done: asyncio.Event) -> None:
    offset = "now"
    while not done.is_set():
        try:
            params = {"offset": offset, "live": "sse"}
            async with client.stream("GET", url, params=params, timeout=httpx.Timeout(5, read=None)) as response:
                event = None
                async for line in response.aiter_lines():
                    if line.startswith("event:"):
                        event = line[6:].strip()
                    elif line.startswith("data:") and event == "control":
                        control = json.loads(line[5:])
                        offset = control.get("streamNextOffset", offset)
                        sub.ready.set()
                        if control.get("streamClosed"):
                            return
                    elif line.startswith("data:") and event == "data":
                        now = time.time()
                        for message in json.loads(line[5:]):
                            sub.received[message["seq"]] = sub.received.get(message["seq"], 0) + 1
                            sub.latencies.append(now - message["t"])
                    if done.is_set():
                        return
        except (httpx.HTTPError, json.JSONDecodeError):
            await asyncio.sleep(0.1)
        if not done.is_set():
            sub.reconnects += 1  # the server ends SSE responses now and then; resume where we were


async def run_fanout(run: Run, opts: FanoutOptions) -> dict[str, Any]:
    (url,) = await create_streams(run.urls[:1], [f"bench-fanout-{uuid.uuid4().hex[:8]}"], "application/json")
    subs = [Subscriber() for _ in range(opts.subscribers)]
    done = asyncio.Event()
    limits = httpx.Limits(max_connections=opts.subscribers + 10)
    async with httpx.AsyncClient(limits=limits, follow_redirects=True) as client:
        readers = [asyncio.create_task(_subscribe(client, url, sub, done)) for sub in subs]
        await asyncio.wait_for(asyncio.gather(*(s.ready.wait() for s in subs)), 30)
        sent = 0
        loop = asyncio.get_running_loop()
        start = loop.time()

        async def write() -> None:
            nonlocal sent
            async with httpx.AsyncClient(timeout=10) as writer:
                while not run.stopped() and loop.time() - start < opts.seconds:
                    body = json.dumps({"seq": sent, "t": time.time()})
                    r = await writer.post(url, content=body, headers={"content-type": "application/json"})
                    if r.status_code in (200, 204):
                        sent += 1
                    await asyncio.sleep(max(start + sent / opts.rate - loop.time(), 0))

        writing = asyncio.create_task(write())
        await run.progress("fanout", opts.seconds, [writing])
        await writing
        drain_until = loop.time() + opts.drain
        while loop.time() < drain_until and any(len(s.received) < sent for s in subs):
            await asyncio.sleep(0.05)
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
    }
    result.update(latency_summary([lat for s in subs for lat in s.latencies]))
    return result
