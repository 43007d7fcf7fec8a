"""SegmentCache over a FileStore: misses, slices, shared fetches, LRU eviction and integrity checks."""

from __future__ import annotations

import asyncio
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.state_machine import records as r
from app.state_machine.commands import Code
from app.state_machine.reader import ColdMiss
from app.tiering import segment as seg
from app.tiering.cache import SegmentCache
from app.tiering.store import FileStore, ObjectInfo, StoreUnavailable, sha256_hex
from tests.state_machine.tiering_helpers import BIG, TH, filled

U32 = struct.Struct(">I")
T0 = 1_700_000_000_000


class CountingStore:
    """A FileStore whose gets are counted and slowed down, so concurrent fetches overlap."""

    def __init__(self, root: Path, delay: float = 0.0) -> None:
        self.inner = FileStore(root)
        self.url = self.inner.url
        self.delay = delay
        self.gets: list[str] = []
        self.down = False
        self._lock = threading.Lock()

    def put(self, key: str, data: bytes) -> None:
        self.inner.put(key, data)

    def get(self, key: str) -> bytes:
        with self._lock:
            self.gets.append(key)
        time.sleep(self.delay)
        if self.down:
            raise StoreUnavailable("down for the test")
        return self.inner.get(key)

    def stat(self, key: str) -> ObjectInfo | None:
        return self.inner.stat(key)

    def delete(self, key: str) -> None:
        self.inner.delete(key)

    def list(self, prefix: str) -> Iterator[str]:
        return self.inner.list(prefix)


def upload(store: CountingStore, name: str, payloads: list[bytes], first: int = 0) -> r.SegmentInfo:
    """Builds and stores a segment of `payloads` starting at `first`; returns what TierSegment would record."""
    recs, pos = [], first
    for i, payload in enumerate(payloads):
        recs.append(seg.Record(pos, T0 + i, payload))
        pos += len(payload)
    data = seg.build("b", name, "application/octet-stream", recs)
    key = seg.segment_key("b", name, first, pos)
    store.put(key, data)
    starts = b"".join(U32.pack(rec.pos - first) for rec in recs)
    return r.SegmentInfo(first, pos, key, len(data), sha256_hex(data), T0, T0 + len(recs) - 1, starts)


def slices(cache: SegmentCache, segment: r.SegmentInfo, lo: int, hi: int) -> list[tuple[int, bytes]]:
    return [(pos, bytes(payload)) for pos, payload in cache.records(segment, lo, hi)]


def fetch(cache: SegmentCache, *segments: r.SegmentInfo) -> None:
    async def run() -> None:
        await asyncio.gather(*(cache.fetch(s) for s in segments))

    asyncio.run(run())


@pytest.fixture()
def store(tmp_path: Path) -> CountingStore:
    return CountingStore(tmp_path / "cold")


def test_miss_raises_cold_miss_naming_the_segment(store: CountingStore) -> None:
    segment = upload(store, "s", [b"abc"])
    cache = SegmentCache(store)
    with pytest.raises(ColdMiss) as info:
        list(cache.records(segment, 0, 3))
    assert info.value.segment == segment
    assert store.gets == [], "a miss does not touch the store; fetch does"


def test_fetch_then_records_returns_the_right_slices(store: CountingStore) -> None:
    # records at 10 "aaa", 13 "bb", 15 "cccc", 19 "d"; the segment is [10, 20)
    segment = upload(store, "s", [b"aaa", b"bb", b"cccc", b"d"], first=10)
    cache = SegmentCache(store)
    fetch(cache, segment)
    assert slices(cache, segment, 10, 20) == [(10, b"aaa"), (13, b"bb"), (15, b"cccc"), (19, b"d")]
    assert slices(cache, segment, 11, 20) == [(11, b"aa"), (13, b"bb"), (15, b"cccc"), (19, b"d")], "mid-record"
    assert slices(cache, segment, 16, 20) == [(16, b"ccc"), (19, b"d")]
    assert slices(cache, segment, 13, 15) == [(13, b"bb")], "records at or past hi are left out"
    assert slices(cache, segment, 10, 16) == [(10, b"aaa"), (13, b"bb"), (15, b"cccc")], "overlapping ones stay whole"
    assert slices(cache, segment, 19, 20) == [(19, b"d")]
    assert slices(cache, segment, 14, 15) == [(14, b"b")]
    assert len(store.gets) == 1 and cache.fetches == 1


def test_concurrent_fetches_of_one_segment_do_one_get(store: CountingStore) -> None:
    store.delay = 0.2
    one = upload(store, "one", [b"x" * 10, b"y" * 5])
    two = upload(store, "two", [b"z"])
    cache = SegmentCache(store)
    fetch(cache, *[one] * 6, two, two)
    assert sorted(store.gets) == sorted([one.key, two.key])
    assert cache.fetches == 2
    fetch(cache, one)
    assert len(store.gets) == 2, "a cached segment is not fetched again"
    assert slices(cache, one, 0, 15) == [(0, b"x" * 10), (10, b"y" * 5)]


def test_lru_eviction_by_max_bytes(store: CountingStore) -> None:
    a, b, c = (upload(store, name, [name.encode() * 1000]) for name in "abc")  # 1000 bytes + 64 each
    cache = SegmentCache(store, max_bytes=2200)
    fetch(cache, a)
    fetch(cache, b)
    assert slices(cache, a, 0, 1000) == [(0, b"a" * 1000)]  # a is now the most recently used
    fetch(cache, c)
    with pytest.raises(ColdMiss):
        list(cache.records(b, 0, 1000))
    assert slices(cache, a, 0, 1) == [(0, b"a" * 1000)]
    assert slices(cache, c, 0, 1) == [(0, b"c" * 1000)]
    assert store.gets == [a.key, b.key, c.key]
    fetch(cache, b)  # evicts a, the least recently used now
    assert store.gets[-1] == b.key
    with pytest.raises(ColdMiss):
        list(cache.records(a, 0, 1000))
    assert slices(cache, c, 0, 1) == [(0, b"c" * 1000)]


def test_a_segment_larger_than_the_cache_is_still_served(store: CountingStore) -> None:
    big = upload(store, "big", [b"B" * 500])
    small = upload(store, "small", [b"s"])
    cache = SegmentCache(store, max_bytes=100)
    fetch(cache, big)
    assert slices(cache, big, 0, 500) == [(0, b"B" * 500)]
    fetch(cache, small)
    assert slices(cache, small, 0, 1) == [(0, b"s")]
    with pytest.raises(ColdMiss):
        list(cache.records(big, 0, 500))


def test_corrupted_object_raises_store_unavailable_and_is_not_cached(store: CountingStore) -> None:
    segment = upload(store, "s", [b"hello", b"world"])
    original = store.inner.get(segment.key)
    damaged = bytearray(original)
    damaged[len(damaged) // 2] ^= 0x01
    store.put(segment.key, bytes(damaged))
    cache = SegmentCache(store)
    with pytest.raises(StoreUnavailable):
        fetch(cache, segment)
    with pytest.raises(ColdMiss):
        list(cache.records(segment, 0, 10))
    store.put(segment.key, original)  # repaired: the next fetch goes to the store again
    fetch(cache, segment)
    assert slices(cache, segment, 0, 10) == [(0, b"hello"), (5, b"world")]
    assert len(store.gets) == 2


def test_size_mismatch_raises_store_unavailable(store: CountingStore) -> None:
    segment = upload(store, "s", [b"hello"])
    data = store.inner.get(segment.key)
    cache = SegmentCache(store)
    store.put(segment.key, data + b"\x00")
    with pytest.raises(StoreUnavailable):
        fetch(cache, segment)
    store.put(segment.key, data)
    wrong_size = r.SegmentInfo(
        segment.lo, segment.hi, segment.key, segment.size + 1, segment.sha256, 0, 0, segment.starts
    )
    with pytest.raises(StoreUnavailable):
        fetch(cache, wrong_size)


def test_missing_object_raises_store_unavailable(store: CountingStore) -> None:
    segment = upload(store, "s", [b"x"])
    store.delete(segment.key)
    cache = SegmentCache(store)
    with pytest.raises(StoreUnavailable) as info:
        fetch(cache, segment)
    assert not isinstance(info.value, KeyError)
    with pytest.raises(ColdMiss):
        list(cache.records(segment, 0, 1))


def test_segment_starting_elsewhere_raises_store_unavailable(store: CountingStore) -> None:
    real = upload(store, "s", [b"abc"], first=5)
    claimed = r.SegmentInfo(0, 3, real.key, real.size, real.sha256, 0, 0, real.starts)
    with pytest.raises(StoreUnavailable):
        fetch(SegmentCache(store), claimed)


def test_store_outage_reaches_every_waiter_and_a_later_fetch_recovers(store: CountingStore) -> None:
    segment = upload(store, "s", [b"data"])
    store.down, store.delay = True, 0.1
    cache = SegmentCache(store)

    async def attempt() -> list[BaseException | None]:
        return await asyncio.gather(*(cache.fetch(segment) for _ in range(4)), return_exceptions=True)

    results = asyncio.run(attempt())
    assert all(isinstance(e, StoreUnavailable) for e in results), results
    assert len(store.gets) == 1
    store.down = False
    fetch(cache, segment)
    assert slices(cache, segment, 0, 4) == [(0, b"data")]


# As the state machine's ColdSource


def read_through(h: TH, cache: SegmentCache, name: str, start: int, max_bytes: int) -> bytes:
    """Reads to the tail the way the server does: on ColdMiss, fetch the segment and read again."""
    meta = h.m(name)
    pos, out, misses = start, b"", 0
    while pos < meta.tail:
        try:
            chunk = h.sm.read(meta, pos, max_bytes, cache)
        except ColdMiss as miss:
            misses += 1
            assert misses < 10
            fetch(cache, miss.segment)
            continue
        out += b"".join(bytes(p) for p in chunk.payloads)
        assert chunk.next_pos > pos, "a read must make progress"
        pos = chunk.next_pos
    return out


def test_state_machine_reads_evicted_ranges_through_the_cache(store: CountingStore) -> None:
    h = filled(payloads=(b"aaa", b"bb", b"cccc", b"d", b"eeeeee"))
    content = h.text("s")
    h.tier("s", 5)
    h.tier("s", 10)
    assert h.evict("s").code is Code.OK
    h.fork("f", "s", offset=3)
    h.append("f", b"FF", ct=None)
    for key, data in h.objects.items():
        if data:
            store.put(key, data)
    cache = SegmentCache(store, max_bytes=BIG)
    for start in range(len(content) + 1):
        for max_bytes in (1, 4, BIG):
            assert read_through(h, cache, "s", start, max_bytes) == content[start:], (start, max_bytes)
    assert read_through(h, cache, "f", 0, BIG) == b"aaaFF"
    assert sorted(store.gets) == sorted({seg.segment_key("b", "s", 0, 5), seg.segment_key("b", "s", 5, 10)})
