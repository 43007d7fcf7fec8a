"""The soak's misbehaving requests: malformed offsets, missing streams, bodies past the limit, invalid
JSON, bad ids, garbage on a raw socket, requests abandoned half-sent, SSE readers that vanish
mid-response. None may get a 5xx, and no rejected or abandoned append may leave data behind."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable

from app.bench.soak_records import binary_record
from app.bench.soak_traffic import BINARY, JSON, WELL_BEHAVED, Traffic


async def sse_abrupt(t: Traffic) -> None:
    """Opens an SSE response over a raw socket, reads part of it, and resets the connection."""
    stream = t.pick()
    path = f"/ds/{t.bucket}/{stream.name}?offset={t.pick_offset(stream, 0.5)}&live=sse"
    request = f"GET {path} HTTP/1.1\r\nHost: {t.host}\r\nAccept: text/event-stream\r\n\r\n".encode()
    await _raw(t, "sse-abrupt", request, read_some=t.rng.randint(1, 300))


async def bad_offset(t: Traffic) -> None:
    stream = t.pick()
    offset = t.rng.choice(
        [
            "abc",
            "-2",
            "1",
            "",
            "0000000000000000_zzzzzzzzzzzzzzzz",
            "9999999999999999_9999999999999999",
            "-1&offset=-1",
            "-1&live=bogus",
            "%00",
            "0" * 200,
        ]
    )
    await t.send("bad-offset", "GET", f"{stream.url}?offset={offset}")


async def missing_stream(t: Traffic) -> None:
    n = t.rng.randrange(1_000_000)
    method, url = t.rng.choice(
        [
            ("GET", f"{t.base}/ds/{t.bucket}/missing-{n}?offset=-1"),
            ("HEAD", f"{t.base}/ds/{t.bucket}/missing-{n}"),
            ("GET", f"{t.base}/ds/nobucket{n}/s0?offset=-1&live=long-poll"),
            ("POST", f"{t.base}/ds/{t.bucket}/missing-{n}"),
        ]
    )
    body = b"x" if method == "POST" else None
    await t.send("missing-stream", method, url, content=body, headers={"content-type": BINARY})


async def oversize(t: Traffic) -> None:
    """A body just past --max-body-bytes, sized up front or chunked: 413, and nothing stored."""
    stream = t.pick(json=False)
    ident = t.ident()
    body = binary_record(ident, t.max_body + 1024, t.rng)
    attempt = t.ledger.add(ident, stream.name, [ident])
    content: bytes | AsyncIterator[bytes] = body if t.rng.random() < 0.5 else _chunks(body, 16384)
    r = await t.send("oversize", "POST", stream.url, content=content, headers={"content-type": BINARY})
    t.settle(attempt, stream, r)


async def invalid_json(t: Traffic) -> None:
    stream = t.pick(json=True)
    ident, body, keys = t.record(stream)
    attempt = t.ledger.add(ident, stream.name, keys)
    broken = t.rng.choice(
        [
            body[: -t.rng.randint(1, 5)],
            body.replace(b'"part"', b"part", 1),
            b"[" + body + b",]",
            body + b"}",
            b"[]",
        ]
    )
    r = await t.send("invalid-json", "POST", stream.url, content=broken, headers={"content-type": JSON})
    t.settle(attempt, stream, r)


async def bad_id(t: Traffic) -> None:
    b = f"{t.base}/ds/{t.bucket}"
    method, url = t.rng.choice(
        [
            ("PUT", f"{b}/a%0d%0ab"),
            ("GET", f"{b}/a%0d%0ab?offset=-1"),
            ("PUT", f"{t.base}/ds/a%0d%0ab"),
            ("PUT", f"{t.base}/ds/AB"),
            ("PUT", f"{t.base}/ds/x"),
            ("GET", f"{b}/x%00y?offset=-1"),
            ("GET", f"{b}/a/%2e%2e/s0?offset=-1"),
            ("PUT", f"{b}/{'y' * 1100}"),
            ("GET", f"{b}/a%ZZb?offset=-1"),
            ("POST", f"{b}/s0/snapshot"),
        ]
    )
    await t.send("bad-id", method, url, headers={"content-type": BINARY})


async def garbage_line(t: Traffic) -> None:
    request = t.rng.choice(
        [
            b"\x16\x03\x01" + t.rng.randbytes(64).replace(b"\n", b"?") + b"\r\n\r\n",
            b"GET / HTTP/9.9\r\n\r\n",
            b"GET\r\n\r\n",
            b"BREW /ds HTTP/1.1\r\nHost: x\r\nthis line has no colon\r\n\r\n",
            b"POST /ds/x/y HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
            b"GET /ds HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 100_000 + b"\r\n\r\n",
        ]
    )
    await _raw(t, "garbage-line", request, read_some=None)


async def half_sent(t: Traffic) -> None:
    """A request cut short: headers then part of the body, or part of the headers; then gone."""
    stream = t.pick(json=False)
    ident = t.ident()
    body = binary_record(ident, t.rng.randint(100, 4000), t.rng)
    t.ledger.add(ident, stream.name, [ident]).outcome = "rejected"  # never fully sent: must not be stored
    head = f"POST /ds/{t.bucket}/{stream.name} HTTP/1.1\r\nHost: {t.host}\r\nContent-Type: {BINARY}\r\n"
    cut = t.rng.randint(1, len(body) - 1)
    request = t.rng.choice(
        [
            f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body[:cut],
            f"{head}Transfer-Encoding: chunked\r\n\r\n{cut:x}\r\n".encode() + body[:cut] + b"\r\n",
            head.encode()[: t.rng.randint(5, len(head))],
        ]
    )
    await _raw(t, "half-sent", request, read_some=0, linger=t.rng.choice((0.0, 0.0, 0.5, 2.0)))


async def _raw(t: Traffic, kind: str, request: bytes, read_some: int | None, linger: float = 0.0) -> None:
    """Sends raw bytes. read_some=None: read the answer to the end; 0: read nothing, linger, and
    abandon; N: read the head and N bytes of the body, then reset the connection."""
    try:
        async with asyncio.timeout(5):
            reader, writer = await asyncio.open_connection(t.host, t.port)
    except (OSError, TimeoutError) as exc:
        t.tally.error(kind, exc)
        return
    try:
        writer.write(request)
        await writer.drain()
        if read_some == 0:
            await asyncio.sleep(linger)
            t.tally.status(kind, "abandoned")
            return
        async with asyncio.timeout(10):
            head = await reader.readuntil(b"\r\n\r\n") if read_some else await reader.read(65536)
            if read_some:
                await reader.read(read_some)
        _raw_status(t, kind, head)
    except (OSError, TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
        if read_some is None and isinstance(exc, ConnectionResetError | asyncio.IncompleteReadError):
            t.tally.status(kind, "closed without answer")
        else:
            t.tally.error(kind, exc)
    finally:
        _reset(writer)


def _raw_status(t: Traffic, kind: str, head: bytes) -> None:
    if not head:
        t.tally.status(kind, "closed without answer")
    elif head.startswith(b"HTTP/1.") and head[9:12].isdigit():
        t.tally.response(kind, int(head[9:12]), b"\r\nretry-after:" in head.lower(), head[:40].decode("latin-1"))
    else:
        t.tally.status(kind, "not HTTP")


async def _chunks(body: bytes, size: int) -> AsyncIterator[bytes]:
    for i in range(0, len(body), size):
        yield body[i : i + size]


def _reset(writer: asyncio.StreamWriter) -> None:
    """Closes with a TCP reset rather than a polite FIN, as a crashed client would."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


ABUSE: dict[str, tuple[int, Callable[[Traffic], Awaitable[None]]]] = {
    "sse-abrupt": (3, sse_abrupt),
    "bad-offset": (4, bad_offset),
    "missing-stream": (3, missing_stream),
    "oversize": (2, oversize),
    "invalid-json": (4, invalid_json),
    "bad-id": (3, bad_id),
    "garbage-line": (2, garbage_line),
    "half-sent": (2, half_sent),
}

# Every kind with its weight: half appends, a third reads, the rest bad or abandoned requests.
MIX = {**WELL_BEHAVED, **ABUSE}
