"""`fanout`: many SSE subscribers on one stream, one writer at a fixed rate; delivery latency and loss.

The subscribers are a Node.js process (fanout_client.mjs, cheap enough for thousands of connections)
or, with `--client python`, asyncio tasks in this process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import shutil
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.bench.append import create_streams
from app.bench.http_load import open_event_stream
from app.bench.run import Run
from app.bench.stats import client_cpu, latency_summary
from app.cluster.peer_client import connect, encode_request

JSON = "application/json"
NODE_CLIENT = Path(__file__).parent / "fanout_client.mjs"
READY_TIMEOUT = 30.0  # seconds for every subscriber to get its first control event


@dataclass
class FanoutOptions:
    subscribers: int = 100
    rate: float = 100.0  # appends per second
    seconds: float = 10.0
    drain: float = 5.0  # how long subscribers may take to catch up after the writer stops
    client: str = "node"  # the subscribers: "node" (fanout_client.mjs) or "python" (asyncio in this process)

    def check(self) -> None:
        """Fails in one line before any server work when the options cannot run here."""
        if self.client not in ("node", "python"):
            raise SystemExit(f"--client must be node or python, not {self.client!r}")
        if self.client == "node" and shutil.which("node") is None:
            raise SystemExit(
                "rill bench fanout: `node` (Node.js 18+) is not installed; install it or use --client python"
            )


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


async def _write(run: Run, url: str, opts: FanoutOptions) -> int:
    """Appends {"seq", "t"} at opts.rate for opts.seconds (with a progress bar); returns how many were accepted."""
    sent = 0
    loop = asyncio.get_running_loop()
    start = loop.time()

    async def write() -> None:
        nonlocal sent
        conn = await connect(url)
        try:
            while not run.stopped() and loop.time() - start < opts.seconds:
                body = json.dumps({"seq": sent, "t": time.time()}).encode()
                response = await conn.request(encode_request("POST", url, {"Content-Type": JSON}, body))
                if response.status in (200, 204):
                    sent += 1
                await asyncio.sleep(max(start + sent / opts.rate - loop.time(), 0))
        finally:
            conn.close()

    writing = asyncio.create_task(write())
    await run.progress("fanout", opts.seconds, [writing])
    await writing
    return sent


async def run_fanout(run: Run, opts: FanoutOptions) -> dict[str, Any]:
    opts.check()
    (url,) = await create_streams(run.urls[:1], [f"bench-fanout-{uuid.uuid4().hex[:8]}"], JSON)
    if opts.client == "node":
        return await _node_fanout(run, url, opts)
    subs = [Subscriber() for _ in range(opts.subscribers)]
    done = asyncio.Event()
    readers = [asyncio.create_task(_subscribe(url, sub, done)) for sub in subs]
    async with asyncio.timeout(READY_TIMEOUT):
        await asyncio.gather(*(s.ready.wait() for s in subs))
    loop = asyncio.get_running_loop()
    start = loop.time()
    cpu_start = client_cpu()
    sent = await _write(run, url, opts)
    drain_until = loop.time() + opts.drain
    while loop.time() < drain_until and any(len(s.received) < sent for s in subs):
        await asyncio.sleep(0.05)
    cpu = client_cpu() - cpu_start
    done.set()
    for task in readers:
        task.cancel()
    await asyncio.gather(*readers, return_exceptions=True)

    expected = sent * len(subs)
    result = _result(opts, sent, cpu / (loop.time() - start))
    result["delivered"] = sum(len(s.received) for s in subs)
    result["losses"] = expected - result["delivered"]
    result["duplicates"] = sum(n - 1 for s in subs for n in s.received.values())
    result["reconnects"] = sum(s.reconnects for s in subs)
    result.update(latency_summary([lat for s in subs for lat in s.latencies]))
    return result


def _result(opts: FanoutOptions, sent: int, cpu_share: float) -> dict[str, Any]:
    """The result in the report's key order; the counts are filled in by the caller."""
    return {
        "subscribers": opts.subscribers,
        "sent": sent,
        "expected": sent * opts.subscribers,
        "delivered": 0,
        "losses": 0,
        "duplicates": 0,
        "reconnects": 0,
        "sent_per_second": sent / opts.seconds,
        "client_cpu": cpu_share,  # share of one core: subscribers and writer together
    }


async def _node_fanout(run: Run, url: str, opts: FanoutOptions) -> dict[str, Any]:
    """The subscribers in a Node.js child (it inherits --pin-client's CPU affinity), the writer here."""
    args = [str(NODE_CLIENT), url, str(opts.subscribers), str(opts.drain)]
    pipe = asyncio.subprocess.PIPE
    node = await asyncio.create_subprocess_exec("node", *args, stdin=pipe, stdout=pipe, stderr=pipe)
    assert node.stdin is not None and node.stdout is not None and node.stderr is not None
    stdout, errors = node.stdout, bytearray()

    async def keep_stderr(stream: asyncio.StreamReader) -> None:
        while line := await stream.readline():
            errors.extend(line)
            del errors[:-2000]  # the tail is enough to say what went wrong

    async def line(timeout: float, what: str) -> bytes:
        try:
            async with asyncio.timeout(timeout):
                got = await stdout.readline()
        except TimeoutError:
            got = b""
        if not got.strip():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1):  # let a dying client's last words arrive
                    await asyncio.shield(stderr_task)
            raise RuntimeError(
                f"fanout client: no {what} in {timeout:.0f} s; stderr: {errors.decode(errors='replace')}"
            )
        return got

    stderr_task = asyncio.create_task(keep_stderr(node.stderr))
    try:
        if (await line(READY_TIMEOUT, "`ready`")).strip() != b"ready":
            raise RuntimeError(f"fanout client: unexpected output; stderr: {errors.decode(errors='replace')}")
        loop = asyncio.get_running_loop()
        start = loop.time()
        cpu_start = client_cpu()
        sent = await _write(run, url, opts)
        node.stdin.write(f"stop {sent}\n".encode())
        await node.stdin.drain()
        report = json.loads(await line(opts.drain + READY_TIMEOUT, "result"))
        elapsed = loop.time() - start
        cpu = client_cpu() - cpu_start + report["cpu_seconds"]
    finally:
        if node.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                node.kill()
        await node.wait()
        stderr_task.cancel()

    result = _result(opts, sent, cpu / elapsed)
    result["delivered"] = report["delivered"]
    result["losses"] = result["expected"] - report["delivered"]
    result["duplicates"] = report["duplicates"]
    result["reconnects"] = report["reconnects"]
    for key in ("p50_ms", "p99_ms", "max_ms"):  # latency_summary's keys; null when nothing arrived
        result[key] = math.nan if report[key] is None else float(report[key])
    return result
