"""Reads of evicted ranges, in the cases names and sizes make hard: a stream made again under a deleted
one's name (through the segment cache, and through the catalog's manifests), a read spanning segments
the cache cannot hold together, and a manifest whose own segments retention released."""

from __future__ import annotations

import asyncio
import functools
from pathlib import Path

import pytest

from app.state_machine.commands import Code, Retain
from app.state_machine.records import SegmentInfo
from app.tiering import catalog
from app.tiering.cache import CacheBusy, SegmentCache, read_through
from tests.state_machine.helpers import B
from tests.tiering.test_packing import Packing

KiB = 1 << 10


def test_a_stream_made_again_under_its_name_reads_its_own_bytes(tmp_path: Path) -> None:
    p = Packing(tmp_path / "cold", pack_below_bytes=0)  # own segments, evicted at once
    p.write("s", b"OLD-DATA")
    p.run()
    assert p.read("s") == b"OLD-DATA"  # now in the cache
    old = p.segments("s")[0]
    p.h.delete("s")
    p.run()
    p.write("s", b"new-data")  # as long as the old one: the same object key
    p.run()
    new = p.segments("s")[0]
    assert (new.key, new.lo, new.hi) == (old.key, old.lo, old.hi) and new.sha256 != old.sha256
    assert p.read("s") == b"new-data"


def _two_segments(p: Packing, record: int) -> None:
    p.write("s", b"a" * record)
    p.write("s", b"b" * record)
    p.run()
    assert [(s.lo, s.hi) for s in p.segments("s")] == [(0, record), (record, 2 * record)]


def test_a_read_spanning_segments_the_cache_cannot_hold_together_completes(tmp_path: Path) -> None:
    p = Packing(tmp_path / "cold", pack_below_bytes=0, segment_max_bytes=256 * KiB)
    record = 600 * KiB
    _two_segments(p, record)
    cache = SegmentCache(p.store, max_bytes=1 << 20)  # one of them at a time
    meta = p.h.meta("s")
    assert meta is not None
    fetched: list[str] = []

    async def fetch(segment: SegmentInfo) -> None:
        fetched.append(segment.key)
        await cache.fetch(segment)

    async def read_all() -> bytes:
        pos, out = record - 100, b""
        while pos < meta.tail:
            chunk = await read_through(functools.partial(p.h.sm.read, meta, pos, 1 << 20, cache), fetch, tries=8)
            out += b"".join(bytes(piece) for piece in chunk.payloads)
            pos = chunk.next_pos
        return out

    assert asyncio.run(read_all()) == b"a" * 100 + b"b" * record
    assert len(fetched) <= 4, "each fetch evicted the segment the read needed next"


def test_a_read_spanning_segments_the_cache_holds_together_is_one_chunk(tmp_path: Path) -> None:
    p = Packing(tmp_path / "cold", pack_below_bytes=0, segment_max_bytes=16)
    _two_segments(p, 20)
    meta = p.h.meta("s")
    assert meta is not None
    chunk = asyncio.run(read_through(lambda: p.h.sm.read(meta, 0, 1 << 20, p.cache), p.cache.fetch, tries=8))
    assert b"".join(bytes(piece) for piece in chunk.payloads) == b"a" * 20 + b"b" * 20
    assert chunk.next_pos == meta.tail


def test_a_read_whose_segments_others_keep_evicting_gives_up(tmp_path: Path) -> None:
    p = Packing(tmp_path / "cold", pack_below_bytes=0, segment_max_bytes=16)
    _two_segments(p, 20)
    meta = p.h.meta("s")
    assert meta is not None

    async def fetch_then_lose(segment: SegmentInfo) -> None:
        pass  # another read evicts every segment before this one can read it

    with pytest.raises(CacheBusy):
        asyncio.run(read_through(lambda: p.h.sm.read(meta, 0, 1 << 20, p.cache), fetch_then_lose, tries=8))


def test_a_stream_made_again_whose_records_are_all_in_packs_has_no_old_manifest(tmp_path: Path) -> None:
    p = Packing(tmp_path / "cold")
    floor = {"index": 0}  # a state backup exists: what is released after it waits for a newer one
    p.worker.backup_floor = lambda: floor["index"]
    p.write("s", b"OLD-DATA-OLD-DATA")  # alone: a segment of its own, and a manifest
    p.run()
    p.h.delete("s")
    p.run()
    p.write("s", b"new")  # made again, and packed together with t
    p.write("t", b"other")
    p.run()
    assert p.segments("s")[0].packed
    floor["index"] = 10**9  # a newer backup: the queue may be worked off
    p.run()
    p.run()
    found = catalog.stream(p.store, B, "s")
    assert found.entries and all(entry.packed for entry in found.entries)
    assert not any(key.endswith("/s/manifest.json") for key in p.objects())


def test_retention_that_releases_the_last_own_segment_takes_the_manifest(tmp_path: Path) -> None:
    p = Packing(tmp_path / "cold")
    p.write("s", b"FIRST-PART")  # alone: its own segment [0, 10), and a manifest
    p.run()
    p.write("s", b"second")  # with t: a pack slice [10, 16)
    p.write("t", b"other")
    p.run()
    assert [(s.lo, s.hi, s.packed) for s in p.segments("s")] == [(0, 10, False), (10, 16, True)]
    assert p.h.one(Retain(B, "s", 10)).code is Code.OK
    p.run()
    p.run()
    found = catalog.stream(p.store, B, "s")
    assert [(entry.first, entry.next) for entry in found.entries] == [(10, 16)]
    assert all(entry.key in p.objects() for entry in found.entries)
