"""A small cache of segments fetched from the object store, for reads of evicted ranges.

Reads are synchronous (`records`, the state machine's ColdSource); a miss raises ColdMiss, the
caller awaits `fetch` and reads again. Fetches of one segment are shared, and every fetched
object is checked against the size and digest recorded when it was tiered.
"""

from __future__ import annotations

import asyncio
import bisect
from collections import OrderedDict
from collections.abc import Iterator

from app.runtime import blocking
from app.state_machine.reader import ColdMiss
from app.state_machine.records import SegmentInfo
from app.tiering import segment as seg
from app.tiering.store import ObjectStore, StoreUnavailable, sha256_hex


class SegmentCache:
    def __init__(self, store: ObjectStore, max_bytes: int = 64 << 20) -> None:
        self.store = store
        self.max_bytes = max_bytes
        self._segments: OrderedDict[str, seg.Loaded] = OrderedDict()
        self._size = 0
        self._fetching: dict[str, asyncio.Future[None]] = {}
        self.fetches = 0
        # Reads of a segment found in memory, and reads that had to wait for it (the read after that
        # fetch is not a hit); read-ahead turns later misses into hits.
        self.hits = 0
        self.misses = 0
        self._missed: set[str] = set()

    def records(self, segment: SegmentInfo, lo: int, hi: int) -> Iterator[tuple[int, memoryview]]:
        loaded = self._segments.get(segment.key)
        if loaded is None:
            self.misses += 1
            self._missed.add(segment.key)
            raise ColdMiss(segment)
        if segment.key in self._missed:
            self._missed.discard(segment.key)
        else:
            self.hits += 1
        self._segments.move_to_end(segment.key)
        positions, payloads = loaded.positions, loaded.payloads
        i = bisect.bisect_right(positions, lo) - 1
        while i < len(positions) and positions[i] < hi:
            start, payload = positions[i], payloads[i]
            yield (lo, payload[lo - start :]) if start < lo else (start, payload)
            i += 1

    def cached(self, segment: SegmentInfo) -> bool:
        return segment.key in self._segments

    def prefetch(self, segment: SegmentInfo) -> None:
        """Starts fetching a segment a sequential reader will want next; failures wait for the real read."""
        if segment.key not in self._segments and segment.key not in self._fetching:
            task = asyncio.ensure_future(self.fetch(segment))
            task.add_done_callback(lambda t: t.cancelled() or t.exception())

    async def fetch(self, segment: SegmentInfo) -> None:
        """Loads the segment into the cache (StoreUnavailable if the store fails)."""
        if segment.key in self._segments:
            return
        pending = self._fetching.get(segment.key)
        if pending is None:
            pending = asyncio.ensure_future(self._load(segment))
            self._fetching[segment.key] = pending
            pending.add_done_callback(lambda _: self._fetching.pop(segment.key, None))
        await asyncio.shield(pending)

    async def _load(self, segment: SegmentInfo) -> None:
        loaded = await blocking.run("cold", self._get_checked, segment)
        self.fetches += 1
        self._segments[segment.key] = loaded
        self._size += loaded.size
        while self._size > self.max_bytes and len(self._segments) > 1:
            _, old = self._segments.popitem(last=False)
            self._size -= old.size

    def _get_checked(self, segment: SegmentInfo) -> seg.Loaded:
        try:
            data = self.store.get(segment.key)
        except KeyError:
            raise StoreUnavailable(f"segment {segment.key} is missing from the object store") from None
        if len(data) != segment.size or sha256_hex(data) != segment.sha256:
            raise StoreUnavailable(f"segment {segment.key} does not match its recorded digest")
        loaded = seg.load(data)
        if loaded.positions[:1] != [segment.lo]:
            raise StoreUnavailable(f"segment {segment.key} does not start at {segment.lo}")
        return loaded
