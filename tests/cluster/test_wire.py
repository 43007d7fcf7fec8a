"""Raft batches in pieces (app/cluster/wire.py): the very bytes of a plain msgpack encode, with large
entries' data sent from where it is, and a connection that hands a large body over as the socket drains."""

from __future__ import annotations

import asyncio
import hashlib
import random

import msgspec
import pytest

from app.cluster import wire
from app.cluster.http1 import WRITE_SLICE, connect, encode_head
from app.raft.messages import AppendEntries, AppendResponse, Entry, Message

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _batch(rng: random.Random) -> list[Message]:
    batch: list[Message] = []
    for _ in range(rng.randrange(1, 4)):
        if rng.random() < 0.3:
            batch.append(AppendResponse(rng.randrange(9), 1, 2, True, rng.randrange(1 << 40)))
            continue
        sizes = [rng.choice([0, 1, 100, wire.LARGE - 1, wire.LARGE, 3 * wire.LARGE]) for _ in range(rng.randrange(5))]
        entries = [
            Entry(2, 10 + i, rng.randbytes(n) if i % 2 else bytearray(rng.randbytes(n))) for i, n in enumerate(sizes)
        ]
        batch.append(AppendEntries(2, 1, 2, 9, 2, entries, 9))
    return batch


@pytest.mark.parametrize("seed", range(40))
def test_pieces_are_the_bytes_of_a_plain_encode(seed: int) -> None:
    batch = _batch(random.Random(seed))
    pieces = wire.encode_pieces(batch)
    body = b"".join(bytes(piece) for piece in pieces)
    assert body == msgspec.msgpack.encode(batch)
    assert wire.size(pieces) == len(body)
    assert wire.sha256_hex(pieces) == hashlib.sha256(body).hexdigest()


def test_a_large_entry_is_a_view_of_its_data_not_a_copy() -> None:
    data = bytearray(b"x" * (1 << 20))
    pieces = wire.encode_pieces([AppendEntries(1, 1, 2, 0, 0, [Entry(1, 1, data)], 0)])
    views = [p for p in pieces if isinstance(p, memoryview) and p.obj is data]
    assert len(views) == 1 and len(views[0]) == len(data)
    assert sum(len(p) for p in pieces if not (isinstance(p, memoryview) and p.obj is data)) < 100


async def test_a_large_body_is_handed_to_the_socket_as_it_drains() -> None:
    body = bytearray(b"y" * (16 * WRITE_SLICE))
    received = 0
    done = asyncio.Event()

    async def slow_reader(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal received
        await reader.readuntil(b"\r\n\r\n")
        while received < len(body):
            received += len(await reader.read(256 * 1024))
            await asyncio.sleep(0.005)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        done.set()

    server = await asyncio.start_server(slow_reader, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/x"
    conn = await connect(url)
    buffered: list[int] = []
    transport = conn._transport
    assert transport is not None

    async def watch() -> None:
        while not done.is_set():
            buffered.append(transport.get_write_buffer_size())
            await asyncio.sleep(0.001)

    watcher = asyncio.ensure_future(watch())
    status, reply = await conn.send_pieces(encode_head("POST", url, {}, len(body)), [memoryview(body)], 30)
    await watcher
    conn.close()
    server.close()
    assert (status, reply, received) == (200, b"ok", len(body))
    assert max(buffered) <= 2 * WRITE_SLICE  # never the whole body in the transport's buffer
