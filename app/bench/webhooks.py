"""`rill bench webhooks`: webhook deliveries per second, and the time from an append's
acknowledgement to the delivery that covers it, with many subscriptions.

One Rill node (webhooks to 127.0.0.1 allowed) and one receiver in this process, answering every
notification `{"done": true}` (so each delivery acknowledges what it showed). Writers append to one
stream per subscription for `seconds`; the receiver notes when each notification arrives and the
tail it covers, which dates every append it includes.
"""

from __future__ import annotations

import asyncio
import bisect
import json
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from app.bench.servers import cpu_seconds, start_rill
from app.bench.stats import client_cpu, latency_summary, rate

JSON = {"content-type": "application/json"}


@dataclass
class WebhookOptions:
    subscriptions: int = 100
    seconds: float = 10.0
    writers: int = 16


@dataclass
class Receiver:
    """A minimal HTTP/1.1 endpoint: notes (arrival, subscription, tail offsets) and answers done."""

    deliveries: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    port: int = 0

    async def start(self) -> asyncio.Server:
        server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        return server

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        answer = b'{"done":true}'
        reply = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 13\r\n\r\n" + answer
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.lower().split(b"\r\n")
                length = next(int(line[15:]) for line in lines if line.startswith(b"content-length:"))
                body = await reader.readexactly(length)
                self.deliveries.append((time.monotonic(), json.loads(body)))
                writer.write(reply)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, StopIteration, asyncio.CancelledError):
            writer.close()


async def _run(options: WebhookOptions, base: str, receiver: Receiver) -> dict[str, Any]:
    appended: dict[str, list[tuple[int, float]]] = {}  # stream -> (offset position, acknowledged at)
    async with httpx.AsyncClient(timeout=30) as client:
        await client.put(f"{base}/bench-wh/ignored", headers=JSON)
        for i in range(options.subscriptions):
            stream = f"bench-wh/{i}"
            await client.put(f"{base}/{stream}", headers=JSON)
            appended[stream] = []
            body = {"type": "webhook", "streams": [stream], "webhook": {"url": f"http://127.0.0.1:{receiver.port}/h"}}
            created = await client.put(f"{base}/__ds/subscriptions/bench-{i}", json=body)
            created.raise_for_status()
        streams = list(appended)
        stop = time.monotonic() + options.seconds
        started, cpu = time.monotonic(), client_cpu()

        async def write(worker: int) -> None:
            n = worker
            while time.monotonic() < stop:
                stream = streams[n % len(streams)]
                response = await client.post(f"{base}/{stream}", headers=JSON, content=b'{"n":%d}' % n)
                appended[stream].append((int(response.headers["stream-next-offset"][17:]), time.monotonic()))
                n += options.writers

        await asyncio.gather(*(write(w) for w in range(options.writers)))
        await asyncio.sleep(3)  # the last deliveries
        elapsed = time.monotonic() - started
    latencies = []
    covered: dict[str, int] = {}
    for arrived, note in sorted(receiver.deliveries, key=lambda d: d[0]):
        for item in note["streams"]:
            stream, tail = item["path"], int(item["tail_offset"][17:])
            times = appended.get(stream, [])
            positions = [p for p, _ in times]
            lo, hi = bisect.bisect_right(positions, covered.get(stream, 0)), bisect.bisect_right(positions, tail)
            latencies += [arrived - at for _, at in times[lo:hi]]
            covered[stream] = max(covered.get(stream, 0), tail)
    appends = sum(len(v) for v in appended.values())
    return {
        "deliveries": len(receiver.deliveries),
        "deliveries_per_second": rate(len(receiver.deliveries), options.seconds),
        "appends": appends,
        "appends_delivered": len(latencies),
        **latency_summary(latencies),
        "client_cpu": (client_cpu() - cpu) / elapsed,
    }


def run_webhooks(options: WebhookOptions) -> dict[str, dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="rill-bench-wh-") as tmp:
        server = start_rill(Path(tmp) / "rill", env={"RILL_WEBHOOK_ALLOWED_NETWORKS": '["127.0.0.1/32"]'})
        try:
            receiver = Receiver()

            async def main() -> dict[str, Any]:
                listening = await receiver.start()
                try:
                    return await _run(options, server.url, receiver)
                finally:
                    listening.close()

            before = cpu_seconds(server.process.pid)
            result = asyncio.run(main())
            result["server_cpu"] = (cpu_seconds(server.process.pid) - before) / (options.seconds + 3)
        finally:
            server.stop()
    return {"rill": result}
