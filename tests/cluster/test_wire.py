"""Raft batches in pieces (app/cluster/wire.py): the very bytes of a plain msgpack encode, with large
entries' data sent from where it is (the connection that sends them: tests/cluster/test_peer_client.py)."""

from __future__ import annotations

import hashlib
import random

import msgspec
import pytest

from app.cluster import wire
from app.raft.messages import AppendEntries, AppendResponse, Entry, Message


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
