"""The state machine's store as a sequence of key-value batches: the body of a Raft checkpoint.

A checkpoint is every pair of every column family at one applied index (which the store itself
records under `APPLIED_KEY`), so loading the pairs into an empty store and opening a
`StateMachine` on it gives exactly the state the sender had at that index.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from app.state_machine import records as r
from app.storage.kv import KV, Batch

# (column family's position in COLUMN_FAMILIES, key, value)
Pair = tuple[int, bytes, bytes]

_SKIPPED = {(r.SM_META, r.SYNCED_KEY)}  # node-local bookkeeping


def export(kv: KV, max_bytes: int = 1 << 20) -> Iterator[list[Pair]]:
    """The store's pairs in column family and key order, in batches of about `max_bytes`."""
    batch: list[Pair] = []
    size = 0
    for position, cf in enumerate(r.COLUMN_FAMILIES):
        for key, value in kv.scan(cf, b""):
            if (cf, key) in _SKIPPED:
                continue
            batch.append((position, key, value))
            size += len(key) + len(value) + 16
            if size >= max_bytes:
                yield batch
                batch, size = [], 0
    if batch:
        yield batch


def load(kv: KV, pairs: Iterable[Pair]) -> None:
    """Writes exported pairs into a store (an empty one, to reproduce the sender's state)."""
    batch = Batch()
    for position, key, value in pairs:
        batch.put(r.COLUMN_FAMILIES[position], key, value)
    kv.write(batch)


def applied_point(kv: KV) -> tuple[int, int]:
    """(index, term) of the last entry the store has applied."""
    return r.decode_applied(kv.get(r.SM_META, r.APPLIED_KEY))
