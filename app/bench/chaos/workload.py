"""The chaos run's clients: plain and idempotent writers, catch-up, long-poll and SSE readers, and
subscription workers, spread over every node and recording each operation in the `History`. They
behave like real clients: a failed request is retried (on another node), a reader resumes from the
last offset it was given, a worker claims again after losing its lease."""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

import httpx

from app.bench.chaos.history import SEPARATOR, Ack, Append, Claim, History, Read, split_payloads
from app.domain.sse import EventParser

TEXT = {"content-type": "text/plain"}
TIMEOUT = httpx.Timeout(5.0, connect=2.0)
SUBSCRIPTION = "chaos"
WAKE_STREAM = "wakes/chaos"


@dataclass
class Options:
    streams: int = 3
    writers: int = 2  # plain appends
    producers: int = 2  # idempotent appends, retried with the same seq until acknowledged
    workers: int = 2  # subscription workers
    pace: float = 0.02  # seconds each writer rests between appends
    lease_ms: int = 2000


@dataclass
class Clients:
    """Shared by all clients: the nodes' URLs, the clock and the history they write."""

    urls: dict[int, str]  # node id -> base URL (http://127.0.0.1:port)
    history: History
    rng: random.Random
    t0: float = field(default_factory=time.monotonic)
    quiet: threading.Event = field(default_factory=threading.Event)  # set by the nemesis: clients hold still
    stopping: asyncio.Event = field(default_factory=asyncio.Event)

    def now(self) -> float:
        return time.monotonic() - self.t0

    def node(self) -> int:
        return self.rng.choice(sorted(self.urls))

    def stream_url(self, node: int, stream: str) -> str:
        return f"{self.urls[node]}/v1/stream/{stream}"

    async def hold(self) -> None:
        """Waits while the nemesis asks for quiet (no request at all, so idle connections time out)."""
        while self.quiet.is_set() and not self.stopping.is_set():
            await asyncio.sleep(0.1)


def stream_names(options: Options) -> list[str]:
    return [f"chaos/s{i}" for i in range(options.streams)]


async def setup(clients: Clients, options: Options) -> None:
    """Creates the streams, the wake stream and the subscription, retrying until a leader answers."""
    async with httpx.AsyncClient(timeout=TIMEOUT) as http:
        for name in stream_names(options):
            await _until_ok(http, "PUT", clients.stream_url(clients.node(), name), headers=TEXT)
        await _until_ok(
            http, "PUT", clients.stream_url(clients.node(), WAKE_STREAM), headers={"content-type": "application/json"}
        )
        body = {"type": "pull-wake", "pattern": "chaos/*", "wake_stream": WAKE_STREAM, "lease_ttl_ms": options.lease_ms}
        url = f"{clients.urls[clients.node()]}/v1/stream/__ds/subscriptions/{SUBSCRIPTION}"
        await _until_ok(http, "PUT", url, json=body)


async def _until_ok(http: httpx.AsyncClient, method: str, url: str, **kw: object) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            r = await http.request(method, url, **kw)  # type: ignore[arg-type]
            if r.status_code < 300 or r.status_code == 409:  # 409: made by an earlier try that timed out
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{method} {url} kept failing")
        await asyncio.sleep(0.3)


def _outcome(r: httpx.Response | None) -> str:
    if r is not None and r.is_success:
        return "ok"
    if r is not None and 400 <= r.status_code < 500 and r.status_code not in (408, 429):
        return "refused"
    return "unknown"


async def _post(http: httpx.AsyncClient, url: str, **kw: object) -> httpx.Response | None:
    try:
        return await http.post(url, **kw)  # type: ignore[arg-type]
    except httpx.HTTPError:
        return None


async def writer(clients: Clients, options: Options, name: str, producer: bool) -> None:
    """Appends `name.N;` to a random stream through a random node; a producer retries the same seq
    (on any node) until it is acknowledged, a plain writer sends a new payload after a failure."""
    streams = stream_names(options)
    stream = clients.rng.choice(streams) if producer else ""
    epoch, seq, n = 0, 0, 0
    async with httpx.AsyncClient(timeout=TIMEOUT) as http:
        while not clients.stopping.is_set():
            await clients.hold()
            payload = f"{name}.{n}"
            n += 1
            target = stream or clients.rng.choice(streams)
            while not clients.stopping.is_set():
                node = clients.node()
                headers = dict(TEXT)
                if producer:
                    headers |= {"producer-id": name, "producer-epoch": str(epoch), "producer-seq": str(seq)}
                start = clients.now()
                r = await _post(http, clients.stream_url(node, target), content=payload + SEPARATOR, headers=headers)
                outcome = _outcome(r)
                clients.history.appends.append(
                    Append(
                        name, node, target, payload, start, clients.now(), outcome,
                        r.status_code if r is not None else 0,
                        (r.headers.get("stream-next-offset") or "") if r is not None else "",
                        name if producer else "", seq if producer else -1,
                    )
                )  # fmt: skip
                if outcome == "ok" or not producer:
                    break
                if outcome == "refused":  # a new epoch starts clean; the payload is given up
                    epoch, seq = epoch + 1, 0
                    break
                await asyncio.sleep(0.1 + clients.rng.random() * 0.2)
            if producer and outcome == "ok":
                seq += 1
            elif outcome != "ok":
                await asyncio.sleep(0.1 + clients.rng.random() * 0.2)
            await asyncio.sleep(options.pace)


@dataclass
class Tail:
    """A reader's place in one stream, kept across requests, reconnects and nodes."""

    name: str
    stream: str
    offset: str = "-1"
    position: int = 0
    partial: str = ""

    def take(self, text: str) -> list[str]:
        done, self.partial = split_payloads(self.partial + text)
        self.position += len(text.encode())
        return done


async def reader(clients: Clients, options: Options, name: str, kind: str, stream: str) -> None:
    """Tails `stream` from its start, each request to a random node, resuming from its last offset."""
    tail = Tail(name, stream)
    async with httpx.AsyncClient(timeout=httpx.Timeout(10.0, connect=2.0)) as http:
        while not clients.stopping.is_set():
            await clients.hold()
            node = clients.node()
            try:
                if kind == "sse":
                    await _sse(clients, http, node, tail)
                else:
                    await _get(clients, http, node, tail, kind)
            except (httpx.HTTPError, ValueError):
                await asyncio.sleep(0.2)


async def _get(clients: Clients, http: httpx.AsyncClient, node: int, tail: Tail, kind: str) -> None:
    live = "&live=long-poll" if kind == "long-poll" else ""
    start = clients.now()
    r = await http.get(f"{clients.stream_url(node, tail.stream)}?offset={tail.offset}{live}")
    if r.status_code not in (200, 204):
        await asyncio.sleep(0.2)
        return
    before = tail.offset
    added = tail.take(r.text)
    tail.offset = r.headers.get("stream-next-offset", tail.offset)
    up = r.headers.get("stream-up-to-date") == "true"
    clients.history.reads.append(
        Read(tail.name, node, tail.stream, kind, start, clients.now(), before, tail.offset, tail.position, up, added)
    )
    if kind == "catch-up" and up:
        await asyncio.sleep(0.3)  # at the tail: look again a little later


async def _sse(clients: Clients, http: httpx.AsyncClient, node: int, tail: Tail) -> None:
    """One SSE connection, up to its end; an answer is recorded at each control event."""
    start = clients.now()
    url = f"{clients.stream_url(node, tail.stream)}?offset={tail.offset}&live=sse"
    async with http.stream("GET", url, timeout=httpx.Timeout(5.0, connect=2.0, read=15.0)) as r:
        if r.status_code != 200:
            await asyncio.sleep(0.2)
            return
        parser = EventParser()
        before, added = tail.offset, []
        async for chunk in r.aiter_bytes():
            for event in parser.feed(chunk):
                if event.kind == "data":
                    added += tail.take(event.data.decode())
                elif event.kind == "control":
                    control = json.loads(event.data)
                    tail.offset = control.get("streamNextOffset", tail.offset)
                    up = bool(control.get("upToDate"))
                    clients.history.reads.append(
                        Read(
                            tail.name, node, tail.stream, "sse", start, clients.now(), before, tail.offset,
                            tail.position, up, added,
                        )
                    )  # fmt: skip
                    before, added = tail.offset, []
            if clients.stopping.is_set() or clients.quiet.is_set():
                return


async def worker(clients: Clients, options: Options, name: str) -> None:
    """Claims the subscription, holds it for a while (sometimes past its lease), acks every stream at
    the tail the claim showed, and starts over."""
    base = f"/v1/stream/__ds/subscriptions/{SUBSCRIPTION}"
    async with httpx.AsyncClient(timeout=TIMEOUT) as http:
        while not clients.stopping.is_set():
            await clients.hold()
            node = clients.node()
            start = clients.now()
            r = await _post(http, f"{clients.urls[node]}{base}/claim", json={"worker": name})
            status = r.status_code if r is not None else 0
            if r is None or status != 200:
                clients.history.claims.append(Claim(name, node, start, clients.now(), status))
                await asyncio.sleep(0.2 + clients.rng.random() * 0.3)
                continue
            got = r.json()
            shown = {s["path"]: s.get("acked_offset") or "" for s in got.get("streams", [])}
            tails = {s["path"]: s.get("tail_offset") or "" for s in got.get("streams", [])}
            generation = int(got["generation"])
            clients.history.claims.append(
                Claim(name, node, start, clients.now(), 200, generation, got["wake_id"], shown)
            )
            await asyncio.sleep(clients.rng.random() * options.lease_ms / 1000 * 1.5)
            offsets = {path: offset for path, offset in tails.items() if offset}
            body = {
                "wake_id": got["wake_id"],
                "generation": generation,
                "acks": [{"stream": path, "offset": offset} for path, offset in offsets.items()],
                "done": True,
            }
            node = clients.node()
            start = clients.now()
            headers = {"authorization": f"Bearer {got['token']}"}
            r = await _post(http, f"{clients.urls[node]}{base}/ack", json=body, headers=headers)
            status = r.status_code if r is not None else 0
            clients.history.acks.append(Ack(name, node, start, clients.now(), status, generation, offsets))
            await asyncio.sleep(0.2)


def clients_of(clients: Clients, options: Options) -> list[Coroutine[Any, Any, None]]:
    """Every client of a run, not started yet."""
    made = [writer(clients, options, f"w{i}", producer=False) for i in range(options.writers)]
    made += [writer(clients, options, f"p{i}", producer=True) for i in range(options.producers)]
    for i, stream in enumerate(stream_names(options)):
        made += [reader(clients, options, f"{kind}{i}", kind, stream) for kind in ("catch-up", "long-poll", "sse")]
    made += [worker(clients, options, f"worker{i}") for i in range(options.workers)]
    return made


async def final_state(
    urls: dict[int, str], streams: list[str]
) -> tuple[dict[int, dict[str, list[str] | None]], dict[int, dict[str, str]]]:
    """Each node's content and tail offset of each stream, read from the start in catch-up reads."""
    final: dict[int, dict[str, list[str] | None]] = {}
    offsets: dict[int, dict[str, str]] = {}
    async with httpx.AsyncClient(timeout=httpx.Timeout(30.0)) as http:
        for node, base in sorted(urls.items()):
            final[node], offsets[node] = {}, {}
            for stream in streams:
                tail, content = Tail("final", stream), []
                try:
                    while True:
                        r = await http.get(f"{base}/v1/stream/{stream}?offset={tail.offset}")
                        r.raise_for_status()
                        content += tail.take(r.text)
                        tail.offset = r.headers["stream-next-offset"]
                        if r.headers.get("stream-up-to-date") == "true":
                            break
                    final[node][stream] = content + ([tail.partial] if tail.partial else [])  # a torn end: phantom
                    offsets[node][stream] = tail.offset
                except (httpx.HTTPError, KeyError):
                    final[node][stream] = None
    return final, offsets
