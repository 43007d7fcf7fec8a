"""The tiering worker's packs on a real file store: small streams share objects, each reads back
alone by a ranged GET after eviction, indexes follow the live slices, a trickling stream's small
segments are merged, and the last slice released takes the pack with it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.state_machine.commands import Code, ForgetObjects
from app.state_machine.reader import ColdMiss
from app.state_machine.records import SegmentInfo
from app.tiering import catalog
from app.tiering import pack as packs
from app.tiering import segment as seg
from app.tiering.cache import SegmentCache
from app.tiering.keys import stream_component
from app.tiering.segment import Record
from app.tiering.store import FileStore, KeyRejected, StoreUnavailable
from app.tiering.worker import TieringConfig, TieringWorker
from tests.state_machine.helpers import OCTET, T0, B, H
from tests.tiering.test_worker_isolation import Harness, Node


class CountingFiles(FileStore):
    """A file store that counts whole and ranged GETs."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.gets = self.ranged = 0

    def get(self, key: str) -> bytes:
        self.gets += 1
        return super().get(key)

    def get_range(self, key: str, start: int, end: int) -> bytes:
        self.ranged += 1
        return super().get_range(key, start, end)


class Packing(Harness):
    def __init__(self, root: Path, **config: int) -> None:
        super().__init__(root, CountingFiles(root))
        settings = {"segment_max_age": 0.0, "local_disk_budget": 0, "retry_jitter": 0.0, **config}
        self.h = H(tail_cache_bytes=0)  # no recent records in memory: evicted ones come from the store
        self.node = Node(self.h)
        self.worker = TieringWorker(self.node, self.store, TieringConfig(**settings))  # type: ignore[arg-type]
        self.cache = SegmentCache(self.store)

    def objects(self) -> list[str]:
        return sorted(self.store.list(""))

    def read(self, name: str) -> bytes:
        """The whole stream as a reader gets it: cold misses fetched through the cache."""
        meta = self.h.meta(name)
        assert meta is not None
        out, pos = b"", 0
        while pos < meta.tail:
            try:
                chunk = self.h.sm.read(meta, pos, 1 << 20, self.cache)
            except ColdMiss as miss:
                asyncio.run(self.cache.fetch(miss.segment))
                continue
            out += b"".join(bytes(p) for p in chunk.payloads)
            pos = chunk.next_pos
        return out

    def segments(self, name: str) -> list[SegmentInfo]:
        meta = self.h.meta(name)
        assert meta is not None
        return list(self.h.sm.segments(meta.sid, 0, meta.tail))


def rec(text: str) -> Record:
    return Record(0, T0, text.encode())


@pytest.fixture()
def p(tmp_path: Path) -> Iterator[Packing]:
    yield Packing(tmp_path / "cold")


def test_two_thousand_small_streams_take_two_objects_and_read_back_alone(p: Packing) -> None:
    written = {f"s{i:04d}": f"payload {i};".encode() * (1 + i % 3) for i in range(2000)}
    for name, data in written.items():
        p.write(name, data)
    p.run()
    objects = p.objects()
    assert len(objects) == 2 and objects[0].startswith(f"{B}/!packs/")  # the pack and its index
    assert all(p.pending(name) == 0 for name in written)
    assert p.h.sm.local_bytes == 0, "every record evicted: reads go to the pack"

    p.store.gets = p.store.ranged = 0
    assert p.read("s0007") == written["s0007"]
    first = p.store.ranged
    assert p.read("s1999") == written["s1999"]
    assert p.store.gets == 0 and first == 2 and p.store.ranged == 3, "footer once, then one GET a slice"

    found = catalog.read(p.store, catalog.listing(p.store, B))
    assert {name for _, name in found} == set(written)
    assert all(len(found[(B, n)].entries) == 1 and found[(B, n)].entries[0].packed for n in written)


def test_many_streams_fill_several_packs_within_their_limits(tmp_path: Path) -> None:
    p = Packing(tmp_path, segment_max_bytes=4096)
    for i in range(300):
        p.write(f"s{i}", bytes([i % 256]) * 50)
    p.run()
    packs_made = [k for k in p.objects() if k.endswith(".parquet")]
    assert 4 <= len(packs_made) <= 6  # 300 x 50 bytes in packs of about 4 KiB
    assert all(p.read(f"s{i}") == bytes([i % 256]) * 50 for i in range(0, 300, 37))


def test_a_lone_small_stream_and_a_large_one_get_segments_of_their_own(p: Packing) -> None:
    p.write("alone", b"small")
    p.run()
    assert [k.split("/", 2)[1] for k in p.objects()] == ["alone", "alone"]  # its segment and manifest
    p.write("big", b"x" * (2 << 20))
    p.write("small", b"y")
    p.write("alone", b"more")
    p.run()
    assert not p.segments("big")[0].packed and p.segments("small")[0].packed
    assert p.read("big") == b"x" * (2 << 20) and p.read("alone") == b"smallmore"


def test_names_that_look_like_the_pack_directory_stay_apart(p: Packing) -> None:
    names = ("!packs", "%21packs", "a/b", "日本", "x" * 300)
    for name in names:
        p.write(name, name.encode() + b";")
        p.write(name, b"2")
    p.run()
    assert {stream_component("!packs"), stream_component("%21packs")} == {"%21packs", "%2521packs"}
    for name in names:
        assert p.segments(name)[0].packed
        assert p.read(name) == name.encode() + b";2"
    assert all("/!packs/" in k for k in p.objects())


def test_the_index_follows_deletes_and_the_last_slice_takes_the_pack(p: Packing) -> None:
    for name in ("a", "b", "c"):
        p.write(name, name.encode() * 3)
    p.run()
    (index_key,) = [k for k in p.objects() if k.endswith(".json")]
    assert [s.stream for s in packs.PackIndex.from_json(p.store.get(index_key)).slices] == ["a", "b", "c"]
    p.h.delete("b")
    p.run()
    assert [s.stream for s in packs.PackIndex.from_json(p.store.get(index_key)).slices] == ["a", "c"]
    p.h.delete("a")
    p.h.delete("c")
    p.run()
    assert p.objects() == [] and p.worker.status()["deletion_queue"] == 0
    assert list(p.h.sm.packs()) == []


def _cold_bytes(p: Packing, name: str) -> bytes | None:
    """What catalog readers (the Spark source, `rill restore`) read of a stream from the store alone."""
    found = catalog.stream(p.store, B, name)
    if found is None:
        return None
    reader = packs.PackReader(p.store)
    out = b""
    for e in found.entries:
        if e.packed:
            out += b"".join(bytes(x) for x in reader.payloads(e.key, e.size, e.group, e.row, e.records))
        else:
            out += b"".join(bytes(payload) for payload in seg.load(p.store.get(e.key)).payloads)
    return out


@pytest.fixture()
def held(tmp_path: Path) -> Packing:
    """A packer whose released objects stay until a newer backup, as on a leader with backups."""
    p = Packing(tmp_path)
    p.worker.backup_floor = lambda: 0  # type: ignore[method-assign]
    return p


def test_a_dropped_streams_slices_leave_its_packs_indexes_at_once(held: Packing) -> None:
    """The last live slice of a pack released: its index is written again with none. It stayed until
    the collector deleted it, and catalog readers took a stream made again under the name for the old
    one plus the new (b"OLD-1OLD-2new" where the server reads b"new")."""
    for body in (b"OLD-1", b"OLD-2"):
        held.write("s", body)
        held.write("t", b"t")
        held.run()
    held.h.delete("s")
    held.h.delete("t")
    held.run()
    assert _cold_bytes(held, "s") is None and _cold_bytes(held, "t") is None
    held.write("s", b"new")
    held.write("u", b"u")
    held.run()
    assert held.read("s") == _cold_bytes(held, "s") == b"new"


def test_a_dropped_streams_manifest_is_emptied_at_once(held: Packing) -> None:
    """A stream with a segment of its own is dropped: its manifest is emptied in the next pass (the
    collector deletes it after the next backup), so catalog readers no longer list the stream."""
    held.write("s", b"OLD-STREAM-DATA")
    held.run()
    assert _cold_bytes(held, "s") == b"OLD-STREAM-DATA"
    held.h.delete("s")
    held.run()
    assert seg.manifest_key(B, "s") in held.objects() and _cold_bytes(held, "s") is None


def test_a_manifest_no_longer_queued_for_deletion_is_not_emptied(held: Packing) -> None:
    """A dropped stream's manifest is emptied only while it waits for the collector: once collected
    (by another leader, say) writing it would leave an object nothing deletes."""
    held.write("s", b"OLD-STREAM-DATA")
    held.run()
    key = seg.manifest_key(B, "s")
    held.h.delete("s")
    held.store.delete(key)  # collected meanwhile
    assert held.h.one(ForgetObjects([key])).code is Code.OK
    held.run()
    assert key not in held.objects()


def test_a_stream_made_again_in_packs_writes_over_an_earlier_streams_manifest(held: Packing) -> None:
    """The earlier stream's manifest was not emptied (another leader's term, say) and is queued for
    deletion: a stream of the name all in packs, which has no manifest of its own, writes one there,
    or catalog readers would take the old segments for it."""
    held.write("s", b"OLD-STREAM-DATA")
    held.run()
    held.h.delete("s")
    held.worker._to_empty.clear()
    held.write("s", b"new")
    held.write("u", b"u")
    held.run()
    assert held.read("s") == _cold_bytes(held, "s") == b"new"


def test_a_trickling_stream_is_merged_into_a_segment_of_its_own(tmp_path: Path) -> None:
    p = Packing(tmp_path, merge_min_segments=4, local_disk_budget=1 << 30)
    for round_ in range(4):
        for name in ("trickle", "other"):
            p.write(name, f"{name}-{round_};".encode())
        p.run()
    (merged,) = p.segments("trickle")
    assert not merged.packed and merged.records == 4
    assert p.worker.status()["segments_merged"] == 2  # "other" too
    assert p.read("trickle") == b"trickle-0;trickle-1;trickle-2;trickle-3;"
    p.run()  # the merged streams released every pack: all four are collected
    assert [k for k in p.objects() if "/!packs/" in k] == []
    assert sorted(k.rsplit("/", 1)[1] for k in p.objects() if k.endswith("manifest.json")) == ["manifest.json"] * 2


class Outage:
    """Makes the packer's uploads of merged segments fail: the first one from `fail_at` on."""

    def __init__(self, p: Packing, fail_at: int) -> None:
        self.real, self.fail_at, self.merges, self.on = p.worker.packer.upload, fail_at, 0, False
        p.worker.packer.upload = self.upload

    def upload(self, segment: SegmentInfo, data: bytes | memoryview) -> None:
        if self.on and segment.records > 1:
            self.merges += 1
            if self.merges == self.fail_at:
                raise StoreUnavailable("the store is down")
        self.real(segment, data)


def _dangling(p: Packing) -> list[str]:
    """Objects a published manifest lists that are not in the store."""
    listed = []
    for key in p.objects():
        if key.endswith("/manifest.json"):
            manifest = seg.Manifest.from_json(p.store.get(key))
            listed += [f"{key.rsplit('/', 1)[0]}/{entry.path}" for entry in manifest.segments]
    return [key for key in listed if key not in p.objects()]


@pytest.mark.parametrize("fail_at", [1, 2])
def test_a_merge_pass_an_outage_stops_leaves_no_stream_unmerged(tmp_path: Path, fail_at: int) -> None:
    p = Packing(tmp_path, merge_min_segments=4, local_disk_budget=1 << 30)
    outage = Outage(p, fail_at)
    for round_ in range(4):
        for name in ("trickle", "other"):
            p.write(name, f"{name}-{round_};".encode())
        outage.on = round_ == 3
        if outage.on:
            with pytest.raises(StoreUnavailable):
                p.run()
        else:
            p.run()
    outage.on = False
    p.run()  # the store is back and nothing new is written: what the stopped pass had left is merged
    for name in ("trickle", "other"):
        (merged,) = p.segments(name)
        assert not merged.packed and merged.records == 4
    assert p.read("other") == b"other-0;other-1;other-2;other-3;"


def test_a_stream_whose_merge_keeps_failing_does_not_stop_the_others_or_the_pass(tmp_path: Path) -> None:
    p = Packing(tmp_path, merge_min_segments=4, local_disk_budget=1 << 30)
    real = p.worker.packer.upload

    def refuse_trickle(segment: SegmentInfo, data: bytes | memoryview) -> None:
        if segment.records > 1 and "trickle" in segment.key:
            raise KeyRejected("this key is refused")
        real(segment, data)

    p.worker.packer.upload = refuse_trickle
    for round_ in range(4):
        for name in ("trickle", "other"):
            p.write(name, f"{name}-{round_};".encode())
        p.run()  # never raises: the refusal is about one stream's key
    (merged,) = p.segments("other")
    assert not merged.packed and merged.records == 4
    assert len(p.segments("trickle")) == 4 and p.read("trickle") == b"trickle-0;trickle-1;trickle-2;trickle-3;"


@pytest.mark.parametrize("fail_at", [0, 2])
def test_a_merged_stream_s_manifest_never_lists_a_collected_object(tmp_path: Path, fail_at: int) -> None:
    p = Packing(tmp_path, merge_min_segments=4, local_disk_budget=1 << 30, pack_below_bytes=0)
    outage = Outage(p, fail_at)  # 0: no outage; 2: the second stream's merge fails, after the first's
    for round_ in range(5):
        for name in ("trickle", "other"):
            p.write(name, f"{name}-{round_};".encode())
        outage.on = round_ == 3
        with contextlib.suppress(StoreUnavailable):
            p.run()
        assert _dangling(p) == []
    outage.on = False
    p.run()
    assert _dangling(p) == [] and p.worker.status()["segments_merged"] >= 2


def test_a_damaged_pack_is_refused_not_served(p: Packing) -> None:
    p.write("a", b"alpha")
    p.write("b", b"beta")
    p.run()
    (pack_key,) = [k for k in p.objects() if k.endswith(".parquet")]
    path = p.root / pack_key
    # Another pack of the same shape, one byte different: its footer and rows are valid, its payloads not.
    forged, _ = packs.build(B, [packs.Slice("a", OCTET, [rec("alphX")]), packs.Slice("b", OCTET, [rec("beta")])])
    assert len(forged) == path.stat().st_size
    path.write_bytes(bytes(forged))
    with pytest.raises(StoreUnavailable):
        p.read("a")
    path.write_bytes(b"not parquet")
    fresh = SegmentCache(p.store)
    meta = p.h.meta("b")
    assert meta is not None
    with pytest.raises(StoreUnavailable):
        asyncio.run(fresh.fetch(p.segments("b")[0]))


def test_a_pack_stops_at_a_segment_s_records_and_a_grown_stream_gives_a_bounded_slice(tmp_path: Path) -> None:
    p = Packing(tmp_path, segment_max_records=10)
    for i in range(30):
        p.write(f"s{i:02d}", b"one record")
    p.run()
    assert len([k for k in p.objects() if k.endswith(".parquet")]) == 3
    assert all(p.segments(f"s{i:02d}")[0].packed for i in range(30))

    grown = Packing(tmp_path / "grown", pack_below_bytes=4096)
    for _ in range(20):
        grown.write("big", b"k" * 1024)
    meta = grown.h.meta("big")
    assert meta is not None
    built = grown.worker.packer._build(B, [meta])
    assert built.command is not None and built.looked_at == 1
    ((_, info),) = built.command.slices
    assert (info.lo, info.hi) == (0, 4096), "a slice stops at pack_below_bytes, on a record boundary"
