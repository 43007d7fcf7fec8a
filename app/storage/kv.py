"""An ordered key-value interface with atomic batches.

The Raft log and the state machine only see this interface, so tests and
simulations can run them on `MemoryKV` while the server runs them on RocksDB.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol

# One batch operation: (column family, key, value); value None means delete.
Op = tuple[str, bytes, bytes | None]


@dataclass
class Batch:
    """Writes that land together or not at all."""

    ops: list[Op] = field(default_factory=list)
    ranges: list[tuple[str, bytes, bytes]] = field(default_factory=list)  # applied before ops

    def put(self, cf: str, key: bytes, value: bytes) -> None:
        self.ops.append((cf, key, value))

    def delete(self, cf: str, key: bytes) -> None:
        self.ops.append((cf, key, None))

    def delete_range(self, cf: str, start: bytes, end: bytes) -> None:
        self.ranges.append((cf, start, end))

    def __len__(self) -> int:
        return len(self.ops) + len(self.ranges)


class KV(Protocol):
    def get(self, cf: str, key: bytes) -> bytes | None: ...

    def scan(self, cf: str, start: bytes, end: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        """Yields pairs with start <= key < end, in key order."""
        ...

    def floor(self, cf: str, key: bytes) -> tuple[bytes, bytes] | None:
        """The pair with the greatest key <= `key`."""
        ...

    def write(self, batch: Batch, sync: bool = False) -> None: ...

    def delete_range(self, cf: str, start: bytes, end: bytes, sync: bool = False) -> None: ...

    def close(self) -> None: ...


class MemoryKV:
    """A sorted in-memory KV for tests and deterministic simulation."""

    def __init__(self, column_families: list[str]) -> None:
        self._data: dict[str, dict[bytes, bytes]] = {cf: {} for cf in column_families}
        self._keys: dict[str, list[bytes]] = {cf: [] for cf in column_families}

    def get(self, cf: str, key: bytes) -> bytes | None:
        return self._data[cf].get(key)

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
        for cf, start, end in batch.ranges:
            keys = self._keys[cf]
            lo, hi = bisect.bisect_left(keys, start), bisect.bisect_left(keys, end)
            for key in keys[lo:hi]:
                del self._data[cf][key]
            del keys[lo:hi]
        for cf, key, value in batch.ops:
            data, keys = self._data[cf], self._keys[cf]
            if value is None:
                if key in data:
                    del data[key]
                    keys.pop(bisect.bisect_left(keys, key))
            else:
                if key not in data:
                    bisect.insort(keys, key)
                data[key] = value

    def delete_range(self, cf: str, start: bytes, end: bytes, sync: bool = False) -> None:
        batch = Batch()
        batch.delete_range(cf, start, end)
        self.write(batch)

    def close(self) -> None:
        pass
