"""An ordered key-value interface with atomic batches.

The Raft log and the state machine only see this interface, so tests and
simulations can run them on `MemoryKV` while the server runs them on RocksDB.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol

PUT, DELETE, DELETE_RANGE = 0, 1, 2
Buffer = bytes | bytearray | memoryview
# A value given in pieces (a header and a payload view), so a large one is never concatenated
# in memory before the store copies it.
Parts = tuple[Buffer, ...]
# One batch operation: (kind, column family, key, value or range end); applied in order.
Op = tuple[int, str, bytes, bytes | Parts | None]


def joined(value: bytes | Parts) -> bytes:
    return value if isinstance(value, bytes) else b"".join(value)


@dataclass
class Batch:
    """Writes that land together or not at all, in the order they were made."""

    ops: list[Op] = field(default_factory=list)

    def put(self, cf: str, key: bytes, value: bytes | Parts) -> None:
        self.ops.append((PUT, cf, key, value))

    def delete(self, cf: str, key: bytes) -> None:
        self.ops.append((DELETE, cf, key, None))

    def delete_range(self, cf: str, start: bytes, end: bytes) -> None:
        self.ops.append((DELETE_RANGE, cf, start, end))

    def __len__(self) -> int:
        return len(self.ops)


class KV(Protocol):
    def get(self, cf: str, key: bytes) -> bytes | None: ...

    def scan(self, cf: str, start: bytes, end: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        """Yields pairs with start <= key < end, in key order."""
        ...

    def scan_heads(
        self, cf: str, start: bytes, end: bytes | None = None, size: int = 0
    ) -> Iterator[tuple[bytes, bytes]]:
        """As `scan`, with at most the first `size` bytes of each value (a large one is not read whole)."""
        ...

    def floor(self, cf: str, key: bytes) -> tuple[bytes, bytes] | None:
        """The pair with the greatest key <= `key`."""
        ...

    def write(self, batch: Batch, sync: bool = False) -> None: ...

    def delete_range(self, cf: str, start: bytes, end: bytes, sync: bool = False) -> None: ...

    def sync_wal(self) -> None:
        """Makes every write made so far durable."""
        ...

    def recover(self) -> bool:
        """After a write failed for want of space: True once the store takes writes again."""
        ...

    def close(self) -> None: ...


class MemoryKV:
    """A sorted in-memory KV for tests and deterministic simulation."""

    def __init__(self, column_families: list[str]) -> None:
        self._data: dict[str, dict[bytes, bytes]] = {cf: {} for cf in column_families}
        self._keys: dict[str, list[bytes]] = {cf: [] for cf in column_families}

    def get(self, cf: str, key: bytes) -> bytes | None:
        return self._data[cf].get(key)

    def scan_heads(
        self, cf: str, start: bytes, end: bytes | None = None, size: int = 0
    ) -> Iterator[tuple[bytes, bytes]]:
        for key, value in self.scan(cf, start, end):
            yield key, value[:size]

    def scan(self, cf: str, start: bytes, end: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        keys = self._keys[cf]
        i = bisect.bisect_left(keys, start)
        data = self._data[cf]
        while i < len(keys):
            key = keys[i]
            if end is not None and key >= end:
                return
            yield key, data[key]
            i += 1

    def floor(self, cf: str, key: bytes) -> tuple[bytes, bytes] | None:
        keys = self._keys[cf]
        i = bisect.bisect_right(keys, key)
        if i == 0:
            return None
        found = keys[i - 1]
        return found, self._data[cf][found]

    def write(self, batch: Batch, sync: bool = False) -> None:
        for kind, cf, key, value in batch.ops:
            data, keys = self._data[cf], self._keys[cf]
            if kind == PUT:
                assert value is not None
                if key not in data:
                    bisect.insort(keys, key)
                data[key] = joined(value)
            elif kind == DELETE:
                if key in data:
                    del data[key]
                    keys.pop(bisect.bisect_left(keys, key))
            else:
                assert isinstance(value, bytes)
                lo, hi = bisect.bisect_left(keys, key), bisect.bisect_left(keys, value)
                for doomed in keys[lo:hi]:
                    del data[doomed]
                del keys[lo:hi]

    def delete_range(self, cf: str, start: bytes, end: bytes, sync: bool = False) -> None:
        batch = Batch()
        batch.delete_range(cf, start, end)
        self.write(batch)

    def sync_wal(self) -> None:
        pass

    def recover(self) -> bool:
        return True

    def close(self) -> None:
        pass
