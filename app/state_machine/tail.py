"""The shared tail: each stream's most recently applied records, kept in memory.

Live readers sit at the tail, so what they read next was applied a moment ago: reads whose range
the cache holds are served from it instead of the store. It is a cache, not state: bounded by
bytes (per stream and in all), empty after a restart or a reload, and a read it cannot serve
whole falls back to the store. Records enter only once their apply batch is in the store, so
nothing uncommitted is ever read from here.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Iterator

from app.storage.kv import Buffer


class Ring:
    """One stream's contiguous run of recent records: positions [start, end)."""

    __slots__ = ("end", "head", "payloads", "positions", "size")

    def __init__(self, pos: int) -> None:
        self.positions: list[int] = [pos]  # a sentinel start until the first record lands
        self.payloads: list[bytes] = []
        self.head = 0  # records before it were dropped (lists are compacted now and then)
        self.size = 0
        self.end = pos

    @property
    def start(self) -> int:
        return self.positions[self.head]

    def push(self, pos: int, payload: bytes) -> None:
        if not self.payloads:
            self.positions[0] = pos
        else:
            self.positions.append(pos)
        self.payloads.append(payload)
        self.size += len(payload)
        self.end = pos + len(payload)

    def pop_oldest(self) -> int:
        """Drops the oldest record; returns its size."""
        size = len(self.payloads[self.head])
        self.payloads[self.head] = b""
        self.head += 1
        self.size -= size
        if self.head > 64 and self.head * 2 > len(self.payloads):
            del self.positions[: self.head], self.payloads[: self.head]
            self.head = 0
        return size

    @property
    def empty(self) -> bool:
        return self.head >= len(self.payloads)

    def pieces(self, lo: int, hi: int, json: bool) -> Iterator[tuple[int, memoryview]]:
        """As the store's scan gives them: records starting in [lo, hi), a byte record cut at `lo`."""
        i = max(bisect_right(self.positions, lo, self.head) - 1, self.head)
        positions, payloads = self.positions, self.payloads
        if positions[i] < lo:
            if not json and lo < positions[i] + len(payloads[i]):
                yield lo, memoryview(payloads[i])[lo - positions[i] :]
            i += 1
        for j in range(i, len(payloads)):
            if positions[j] >= hi:
                return
            yield positions[j], memoryview(payloads[j])


class TailCache:
    def __init__(self, budget: int = 64 << 20, per_stream: int = 4 << 20) -> None:
        self.budget = budget
        self.per_stream = min(per_stream, budget)
        self.size = 0
        self._rings: OrderedDict[int, Ring] = OrderedDict()  # least recently appended first
        self._pending: list[tuple[int, int, bytes]] = []

    def stage(self, sid: int, pos: int, body: Buffer) -> None:
        """A record of the apply in progress; it enters the cache when the batch is committed."""
        if self.budget and len(body) <= self.per_stream:
            self._pending.append((sid, pos, bytes(body)))  # a copy: a view would pin the whole entry
        else:
            self._pending.append((sid, pos, b""))

    def commit(self) -> None:
        pending, self._pending = self._pending, []
        for sid, pos, payload in pending:
            self._add(sid, pos, payload)
        while self.size > self.budget:
            sid, ring = next(iter(self._rings.items()))
            self.size -= ring.pop_oldest()
            if ring.empty:
                del self._rings[sid]

    def discard_staged(self) -> None:
        self._pending = []

    def drop(self, sid: int) -> None:
        ring = self._rings.pop(sid, None)
        if ring is not None:
            self.size -= ring.size

    def _add(self, sid: int, pos: int, payload: bytes) -> None:
        ring = self._rings.get(sid)
        if ring is not None and ring.end != pos:
            self.drop(sid)  # a gap: a record that never came through here
            ring = None
        if not payload:
            self.drop(sid)  # too large to keep: the next record starts a new ring
            return
        if ring is None:
            ring = self._rings[sid] = Ring(pos)
        else:
            self._rings.move_to_end(sid)
        ring.push(pos, payload)
        self.size += len(payload)
        while ring.size > self.per_stream:
            self.size -= ring.pop_oldest()

    def covering(self, sid: int, lo: int, hi: int) -> Ring | None:
        """The ring holding all of [lo, hi) of stream `sid`'s own records, if one does."""
        ring = self._rings.get(sid)
        if ring is None or ring.empty or lo < ring.start or hi > ring.end:
            return None
        return ring
