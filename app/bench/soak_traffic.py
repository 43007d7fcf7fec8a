"""The soak's well-behaved request kinds (appends and reads) and the state they share. Each kind
sends one request, counts what came back in the `Tally`, and enters every append it attempts in the
`Ledger`. The misbehaving kinds are in `soak_abuse`."""

from __future__ import annotations

import asyncio
import base64
import json
import random
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx

from app.bench.soak_records import (
    Attempt,
    Ledger,
    binary_record,
    json_body,
    json_keys,
    json_messages,
    parse_binary,
    parse_json,
)

BINARY, JSON = "application/octet-stream", "application/json"


@dataclass
class Producer:
    ident: str
    epoch: int = 0
    seq: int = 0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    last: tuple[bytes, dict[str, str]] | None = None  # the last acknowledged append, to send again


@dataclass
class Stream:
    name: str
    url: str
    json: bool
    offsets: list[str] = field(default_factory=list)  # recent Stream-Next-Offsets: record boundaries
    producers: list[Producer] = field(default_factory=list)

    @property
    def content_type(self) -> str:
        return JSON if self.json else BINARY

    def seen(self, offset: str | None) -> None:
        if offset:
            self.offsets.append(offset)
            del self.offsets[:-50]


@dataclass
class Tally:
    by_kind: Counter[str] = field(default_factory=Counter)
    statuses: Counter[str] = field(default_factory=Counter)
    kind_statuses: dict[str, Counter[str]] = field(default_factory=dict)
    connection_errors: Counter[str] = field(default_factory=Counter)  # kind -> count
    error_types: Counter[str] = field(default_factory=Counter)
    bad_5xx: int = 0  # 5xx other than 503/507 with Retry-After
    read_corrupt: int = 0  # live or catch-up reads whose bytes did not parse back into records
    sse_events: int = 0
    examples: list[str] = field(default_factory=list)

    def status(self, kind: str, status: str) -> None:
        self.by_kind[kind] += 1
        self.statuses[status] += 1
        self.kind_statuses.setdefault(kind, Counter())[status] += 1

    def response(self, kind: str, code: int, retry_after: bool, what: str = "") -> None:
        self.status(kind, str(code))
        if code >= 500 and not (code in (503, 507) and retry_after):
            self.bad_5xx += 1
            self.note(f"{kind}: {code} {what}".strip())

    def error(self, kind: str, exc: BaseException) -> None:
        self.by_kind[kind] += 1
        self.connection_errors[kind] += 1
        self.error_types[type(exc).__name__] += 1

    def note(self, text: str) -> None:
        if len(self.examples) < 20:
            self.examples.append(text)


class Traffic:
    def __init__(self, base: str, bucket: str, streams: int, max_body: int, live_seconds: float, seed: int) -> None:
        self.base, self.bucket, self.max_body = base.rstrip("/"), bucket, max_body
        self.rng = random.Random(seed)
        self.streams = [
            Stream(f"s{i}", f"{self.base}/ds/{bucket}/s{i}", json=i % 2 == 1) for i in range(max(streams, 2))
        ]
        for s in self.streams:
            s.producers = [Producer(f"soak-{bucket}-{s.name}-p{k}") for k in range(2)]
        self.ledger, self.tally = Ledger(), Tally()
        self.live_seconds = live_seconds
        self._next_id = 0
        self.stored_bytes = 0  # what read_back found, to set RSS growth against
        # httpcore's pool does work quadratic in its connections on every request (and polls each idle
        # socket), which made the generator the bottleneck at 200 req/s. So short requests take one of
        # 32 one-connection clients from a queue (waiting there is cheap), and each long-poll and SSE
        # reader gets a client of its own, as an independent reader would have.
        self.tls = httpx.create_ssl_context()  # built once: loading the CA bundle per client costs ~30 ms
        one = httpx.Limits(max_connections=1, max_keepalive_connections=1)
        self.slots: asyncio.Queue[httpx.AsyncClient] = asyncio.Queue()
        for _ in range(32):
            self.slots.put_nowait(httpx.AsyncClient(timeout=httpx.Timeout(30, connect=5), limits=one, verify=self.tls))
        self.live_timeout = httpx.Timeout(live_seconds + 30, connect=5)
        parts = urlsplit(self.base)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80

    async def setup(self) -> None:
        async with self.live_client() as client:
            (await client.put(f"{self.base}/ds/{self.bucket}")).raise_for_status()
            for s in self.streams:
                (await client.put(s.url, headers={"content-type": s.content_type})).raise_for_status()

    async def close(self) -> None:
        while not self.slots.empty():
            await self.slots.get_nowait().aclose()

    def live_client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(timeout=self.live_timeout, verify=self.tls)

    def ident(self) -> str:
        self._next_id += 1
        return f"{self._next_id:012d}"

    def pick(self, json: bool | None = None) -> Stream:
        return self.rng.choice([s for s in self.streams if json is None or s.json == json])

    async def send(self, kind: str, method: str, url: str, *, live: bool = False, **kw: Any) -> httpx.Response | None:
        try:
            if live:
                async with self.live_client() as client:
                    r = await client.request(method, url, **kw)
            else:
                client = await self.slots.get()
                try:
                    r = await client.request(method, url, **kw)
                finally:
                    self.slots.put_nowait(client)
        except httpx.HTTPError as exc:
            self.tally.error(kind, exc)
            return None
        self.tally.response(kind, r.status_code, "retry-after" in r.headers, f"{method} {url}")
        return r

    def settle(self, attempt: Attempt, stream: Stream, r: httpx.Response | None) -> None:
        if r is not None and r.is_success:
            attempt.outcome = "acked"
            stream.seen(r.headers.get("stream-next-offset"))
        elif r is not None and 400 <= r.status_code < 500:
            attempt.outcome = "rejected"

    def record(self, stream: Stream) -> tuple[str, bytes, list[str]]:
        """A new append for `stream`: (id, body, ledger keys)."""
        ident = self.ident()
        if not stream.json:
            large = self.rng.random() < 0.05  # now and then a record that spans several socket reads
            filler = self.rng.randint(8192, 32768) if large else self.rng.randint(16, 2048)
            return ident, binary_record(ident, filler, self.rng), [ident]
        parts = self.rng.choice((1, 1, 1, 2, 3, 5))
        body = json_body(json_messages(ident, parts, self.rng.randint(8, 600)), self.rng.random() < 0.5)
        return ident, body, json_keys(ident, parts)

    async def _append(self, kind: str, stream: Stream) -> None:
        ident, body, keys = self.record(stream)
        attempt = self.ledger.add(ident, stream.name, keys)
        r = await self.send(kind, "POST", stream.url, content=body, headers={"content-type": stream.content_type})
        self.settle(attempt, stream, r)

    async def append_binary(self) -> None:
        await self._append("append-binary", self.pick(json=False))

    async def append_json(self) -> None:
        await self._append("append-json", self.pick(json=True))

    async def append_producer(self) -> None:
        """An idempotent append, retried with the same seq while the answer is unknown."""
        stream = self.pick()
        producer = self.rng.choice(stream.producers)
        async with producer.lock:
            ident, body, keys = self.record(stream)
            attempt = self.ledger.add(ident, stream.name, keys)
            headers = {
                "content-type": stream.content_type,
                "producer-id": producer.ident,
                "producer-epoch": str(producer.epoch),
                "producer-seq": str(producer.seq),
            }
            for retry in range(4):
                kind = "append-producer" if retry == 0 else "producer-resend"
                r = await self.send(kind, "POST", stream.url, content=body, headers=headers)
                self.settle(attempt, stream, r)
                if attempt.outcome != "unknown":
                    break
                await asyncio.sleep(0.2 * (retry + 1))
            if attempt.outcome == "acked":
                producer.seq += 1
                producer.last = (body, headers)
            else:  # the seq may or may not be taken: a new epoch starts clean at seq 0
                producer.epoch, producer.seq, producer.last = producer.epoch + 1, 0, None

    async def producer_retry(self) -> None:
        """Sends an acknowledged producer append again, as a client retrying would: stored once, 204."""
        stream = self.pick()
        producer = self.rng.choice(stream.producers)
        async with producer.lock:
            if producer.last is None:
                self.tally.status("producer-retry", "nothing to retry yet")
                return
            body, headers = producer.last
            r = await self.send("producer-retry", "POST", stream.url, content=body, headers=headers)
            if r is not None and r.status_code != 204:
                self.tally.note(f"producer-retry answered {r.status_code}, expected 204")

    def pick_offset(self, stream: Stream, start_share: float) -> str:
        if not stream.offsets or self.rng.random() < start_share:
            return "-1"
        return self.rng.choice(stream.offsets)

    def _check_read(self, kind: str, stream: Stream, body: bytes) -> None:
        try:
            junk = parse_json(body)[1] if stream.json else parse_binary(body, partial_tail=True)[1]
        except ValueError:
            junk = 1
        if junk:
            self.tally.read_corrupt += 1
            self.tally.note(f"{kind} on {stream.name}: the body did not parse back into records")

    async def catch_up_read(self) -> None:
        stream = self.pick()
        r = await self.send("catch-up-read", "GET", f"{stream.url}?offset={self.pick_offset(stream, 0.2)}")
        if r is not None and r.status_code == 200:
            self._check_read("catch-up-read", stream, r.content)

    async def long_poll(self) -> None:
        stream = self.pick()
        offset = stream.offsets[-1] if stream.offsets else "now"
        r = await self.send("long-poll", "GET", f"{stream.url}?offset={offset}&live=long-poll", live=True)
        if r is not None and r.status_code == 200:
            self._check_read("long-poll", stream, r.content)

    async def sse(self) -> None:
        """Reads a few events, then disconnects politely."""
        stream = self.pick()
        offset = "now" if self.rng.random() < 0.2 else self.pick_offset(stream, 0.3)
        wanted = self.rng.randint(1, 6)
        binary: list[bytes] = []  # a data event may end mid-record (reads stop at a size): parse them joined
        try:
            async with (
                self.live_client() as client,
                client.stream("GET", f"{stream.url}?offset={offset}&live=sse") as r,
            ):
                self.tally.response("sse", r.status_code, "retry-after" in r.headers)
                if r.status_code != 200:
                    return
                async with asyncio.timeout(min(self.live_seconds, 5)):
                    async for event, data in _events(r.aiter_lines()):
                        self._check_event(stream, event, data, binary)
                        wanted -= 1
                        if wanted == 0:
                            break
        except TimeoutError:
            pass  # the stream went quiet before we had our events: a normal end
        except httpx.HTTPError as exc:
            self.tally.error("sse", exc)
        if binary:
            self._check_read("sse", stream, b"".join(binary))

    def _check_event(self, stream: Stream, event: str, data: str, binary: list[bytes]) -> None:
        self.tally.sse_events += 1
        if event == "control":
            try:
                ok = "streamNextOffset" in json.loads(data)
            except ValueError:
                ok = False
            if not ok:
                self.tally.read_corrupt += 1
                self.tally.note(f"sse on {stream.name}: control event without streamNextOffset: {data[:100]}")
        elif event == "data" and stream.json:
            self._check_read("sse", stream, data.encode())  # JSON events always hold whole messages
        elif event == "data":
            binary.append(base64.b64decode(data))

    async def read_back(self, stream: Stream) -> tuple[Counter[str], int]:
        """Every record of a stream from the start (how many times each key is there, junk units)."""
        offset, chunks = "-1", []
        async with httpx.AsyncClient(timeout=60) as client:
            while True:
                r = await client.get(f"{stream.url}?offset={offset}")
                r.raise_for_status()
                chunks.append(r.content)
                self.stored_bytes += len(r.content)
                offset = r.headers["stream-next-offset"]
                if r.headers.get("stream-up-to-date") == "true":
                    break
        if not stream.json:
            ids, junk = parse_binary(b"".join(chunks))
            return Counter(ids), junk
        keys: list[str] = []
        junk = 0
        for chunk in chunks:
            try:
                found, bad = parse_json(chunk)
            except ValueError:
                found, bad = [], 1
            keys += found
            junk += bad
        return Counter(keys), junk


async def _events(lines: AsyncIterator[str]) -> AsyncIterator[tuple[str, str]]:
    """(event, data) of a Server-Sent Events body; comments (pings) are skipped."""
    event, data = "message", list[str]()
    async for line in lines:
        if not line:
            if data:
                yield event, "\n".join(data)
            event, data = "message", list[str]()
        elif line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))


# Weights in the soak's mix (see soak_abuse.MIX for the whole mix).
WELL_BEHAVED: dict[str, tuple[int, Callable[[Traffic], Awaitable[None]]]] = {
    "append-binary": (22, Traffic.append_binary),
    "append-json": (16, Traffic.append_json),
    "append-producer": (10, Traffic.append_producer),
    "producer-retry": (2, Traffic.producer_retry),
    "catch-up-read": (14, Traffic.catch_up_read),
    "long-poll": (8, Traffic.long_poll),
    "sse": (8, Traffic.sse),
}
