"""A small cache of segments fetched from the object store, for reads of evicted ranges.

Reads are synchronous (`records`, the state machine's ColdSource); a miss raises ColdMiss, the
caller awaits `fetch` and reads again. Fetches of one segment are shared, and every fetched
object is checked against the size and digest recorded when it was tiered. A pack's slice is
fetched alone (its row group's payloads, by a ranged GET) and checked against its own digest.
"""

from __future__ import annotations

import asyncio
import bisect
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator

from app.runtime import blocking
from app.state_machine.reader import Chunk, ColdMiss
from app.state_machine.records import SegmentInfo
from app.tiering import segment as seg
from app.tiering.pack import PackReader, slice_digest
from app.tiering.store import ObjectStore, StoreUnavailable, sha256_hex


class CacheBusy(Exception):
    """Every segment a read fetched was evicted by other reads before it could use it."""


async def read_through(read: Callable[[], Chunk], fetch: Callable[[SegmentInfo], Awaitable[None]], tries: int) -> Chunk:
    """`read()`, fetching each segment it misses and reading again, at most `tries` times.

    A chunk spanning segments the cache cannot hold together would fetch them in turn forever: once
    a segment this read fetched is missing again, the read answers with the records it had before
    its last miss (the client reads on from where they end)."""
    partial: Chunk | None = None
    fetched: set[str] = set()
    for _ in range(tries):
        try:
            return read()
        except ColdMiss as miss:
            partial = miss.partial or partial
            if partial is not None and slot(miss.segment) in fetched:
                return partial
            fetched.add(slot(miss.segment))
            await fetch(miss.segment)
    if partial is not None:
        return partial
    raise CacheBusy


def slot(segment: SegmentInfo) -> str:
    """The cache's key for a segment: its object, or for a pack's slice the slice within it, with
    their digest. A stream deleted and made again under its name reuses its segments' keys, so the
    key alone could hand out the old stream's bytes."""
    if segment.packed:
        return f"{segment.key}#{segment.group}:{segment.row}@{segment.digest}"
    return f"{segment.key}@{segment.sha256}"


class SegmentCache:
    def __init__(self, store: ObjectStore, max_bytes: int = 64 << 20) -> None:
        self.store = store
        self.packs = PackReader(store)
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
        key = slot(segment)
        loaded = self._segments.get(key)
        if loaded is None:
            self.misses += 1
            self._missed.add(key)
            raise ColdMiss(segment)
        if key in self._missed:
            self._missed.discard(key)
        else:
            self.hits += 1
        self._segments.move_to_end(key)
        positions, payloads = loaded.positions, loaded.payloads
        i = bisect.bisect_right(positions, lo) - 1
        while i < len(positions) and positions[i] < hi:
            start, payload = positions[i], payloads[i]
            yield (lo, payload[lo - start :]) if start < lo else (start, payload)
            i += 1

    def cached(self, segment: SegmentInfo) -> bool:
        return slot(segment) in self._segments

    def prefetch(self, segment: SegmentInfo) -> None:
        """Starts fetching a segment a sequential reader will want next; failures wait for the real read."""
        if slot(segment) not in self._segments and slot(segment) not in self._fetching:
            task = asyncio.ensure_future(self.fetch(segment))
            task.add_done_callback(lambda t: t.cancelled() or t.exception())

    async def fetch(self, segment: SegmentInfo) -> None:
        """Loads the segment into the cache (StoreUnavailable if the store fails)."""
        key = slot(segment)
        if key in self._segments:
            return
        pending = self._fetching.get(key)
        if pending is None:
            pending = asyncio.ensure_future(self._load(segment))
            self._fetching[key] = pending
            pending.add_done_callback(lambda _: self._fetching.pop(key, None))
        await asyncio.shield(pending)

    async def _load(self, segment: SegmentInfo) -> None:
        loaded = await blocking.run("cold", self._get_checked, segment)
        self.fetches += 1
        self._segments[slot(segment)] = loaded
        self._size += loaded.size
        while self._size > self.max_bytes and len(self._segments) > 1:
            _, old = self._segments.popitem(last=False)
            self._size -= old.size

    def _get_checked(self, segment: SegmentInfo) -> seg.Loaded:
        if segment.packed:
            return self._get_slice(segment)
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

    def _get_slice(self, segment: SegmentInfo) -> seg.Loaded:
        try:
            payloads = self.packs.payloads(segment.key, segment.size, segment.group, segment.row, segment.records)
        except KeyError:
            raise StoreUnavailable(f"pack {segment.key} is missing from the object store") from None
        except StoreUnavailable:
            raise
        except Exception as exc:  # noqa: BLE001 - a damaged footer raises any of pyarrow's errors, not only IO or value ones
            raise StoreUnavailable(f"pack {segment.key} cannot be read: {exc}") from exc
        positions = segment.record_starts()
        ends = [*positions[1:], segment.hi]
        lengths_fit = len(payloads) == len(positions) and all(
            b - a == len(p) for a, b, p in zip(positions, ends, payloads, strict=True)
        )
        if not lengths_fit or slice_digest(payloads) != segment.digest:
            raise StoreUnavailable(f"pack {segment.key} does not hold the slice recorded at {segment.lo}")
        return seg.Loaded(positions, payloads, segment.hi - segment.lo + 64 * len(payloads))
