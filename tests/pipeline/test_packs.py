"""The `rill` data source over packs: streams with no manifest, a manifest naming slices, dead slices, pruning."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from app.domain.offsets import format_offset
from app.pipeline import planning
from app.pipeline.cold import planned_tables, segments_between, starts_between
from app.pipeline.options import ReadOptions
from app.pipeline.planning import covering, pack, plan
from app.tiering import pack as packs
from app.tiering.segment import Manifest, Record, build, entry, manifest_key, segment_key
from app.tiering.store import StoreOptions, open_store
from tests.pipeline.conftest import BASE_MS, FAKE_KEYS, Cold, expected, load, rows, s3_options
from tests.pipeline.packs import Written, manifest_entry, records, write_pack

BUCKET = "pk"
PACKED = ["p/0", "p/1", "p/2", "p/3"]  # no segment of their own: no manifest
LATER = BASE_MS + 100_000  # pack B's records are appended from here on
BIG = 100 * 1024  # p/2's records in pack A: its row group closes after them


@dataclass
class Packed:
    cold: Cold
    a: Written
    b: Written

    def live(self) -> list[str]:
        return [*PACKED, "ghost", "mixed"]


def _records(stream: str, start: int, first: int, count: int, at: int, size: int = 0) -> list[Record]:
    payloads = [bytes([65 + i % 26]) * size if size else f"{stream}#{first + i};".encode() for i in range(count)]
    return records(start, [at + 1000 * (first + i) for i in range(count)], payloads)


def _next(recs: list[Record]) -> int:
    return recs[-1].pos + len(recs[-1].payload)


def fill_packs(cold: Cold) -> Packed:
    """Pack A then pack B of the PACKED streams; "mixed" with a segment of its own, then a slice in each;
    in B, a live "ghost" beside a dead slice of an older stream of that name at the same offsets."""
    first = {s: _records(s, 0, 0, 3, BASE_MS, BIG if s == "p/2" else 0) for s in PACKED}
    second = {s: _records(s, _next(first[s]), 3, 3, LATER) for s in PACKED}
    own = _records("mixed", 0, 0, 4, BASE_MS)
    mixed_a = _records("mixed", _next(own), 4, 3, BASE_MS)
    mixed_b = _records("mixed", _next(mixed_a), 7, 3, LATER)
    dead = records(0, [LATER] * 4, [f"old ghost #{i};".encode() for i in range(4)])
    ghost = _records("ghost", 0, 0, 3, LATER)

    def piece(stream: str, recs: list[Record]) -> packs.Slice:
        return packs.Slice(stream, "text/plain", recs)

    a_slices = [*(piece(s, first[s]) for s in PACKED[:3]), piece("mixed", mixed_a), piece("p/3", first["p/3"])]
    a = write_pack(cold.store, BUCKET, a_slices)
    b_slices = [piece("p/0", second["p/0"]), piece("ghost", dead), piece("p/1", second["p/1"]), piece("ghost", ghost)]
    b_slices += [piece("mixed", mixed_b), *(piece(s, second[s]) for s in PACKED[2:])]
    b = write_pack(cold.store, BUCKET, b_slices, dead=[1])

    data = build(BUCKET, "mixed", "text/plain", own)
    cold.store.put(segment_key(BUCKET, "mixed", 0, _next(own)), data)
    # The manifest names the slice in A; the one in B is in B's index only (a manifest one publish behind).
    segments = [entry(BUCKET, "mixed", own, data), manifest_entry(BUCKET, a, "mixed")]
    manifest = Manifest(BUCKET, "mixed", "text/plain", segments)
    cold.store.put(manifest_key(BUCKET, "mixed"), manifest.to_json())

    for s in PACKED:
        cold.records[(BUCKET, s)] = first[s] + second[s]
    cold.records[(BUCKET, "ghost")] = ghost
    cold.records[(BUCKET, "mixed")] = own + mixed_a + mixed_b
    cold.manifests[(BUCKET, "mixed")] = manifest
    return Packed(cold, a, b)


@pytest.fixture(scope="module")
def file_packed(tmp_path_factory: pytest.TempPathFactory) -> Packed:
    root = tmp_path_factory.mktemp("packed")
    return fill_packs(Cold("file", {"store": root.as_uri()}, open_store(root.as_uri())))


@pytest.fixture(scope="module")
def s3_packed(moto_url: str) -> Packed:
    options = s3_options(moto_url, "packed")
    store = open_store(options["store"], StoreOptions(endpoint_url=moto_url, path_style=True, **FAKE_KEYS))
    return fill_packs(Cold("s3", options, store))


@pytest.fixture(params=["file", "s3"])
def packed(request: pytest.FixtureRequest) -> Packed:
    return request.getfixturevalue(f"{request.param}_packed")  # type: ignore[no-any-return]


def test_a_bucket_of_packs_reads_as_the_records_written(spark: SparkSession, packed: Packed) -> None:
    cold = packed.cold
    assert not [k for k in cold.store.list(f"{BUCKET}/p") if k.endswith("manifest.json")], "packed only"
    planned = plan(cold.opts(BUCKET))
    assert len(planned) == 2 * len(PACKED) + 1 + 3  # two slices each; ghost's live one; mixed's three
    df = load(spark, cold.opts(BUCKET))
    # A partition for mixed's own segment and one per pack, not one per slice.
    assert df.rdd.getNumPartitions() == len(pack(planned, 0)) == 3
    assert rows(df) == expected(cold, BUCKET, packed.live())
    assert packed.a.index.size == len(cold.store.get(packed.a.key))
    assert len({p.group for p in packed.a.placements}) >= 2, "pack A has several row groups"


def test_a_stream_with_segments_and_slices_reads_through_its_manifest(spark: SparkSession, packed: Packed) -> None:
    cold = packed.cold
    planned = plan(cold.opts(BUCKET, stream="mixed"))
    assert [p.key for p in planned] == [f"{BUCKET}/mixed/{cold.manifests[(BUCKET, 'mixed')].segments[0].path}",
                                        packed.a.key, packed.b.key]  # fmt: skip
    assert [p.packed for p in planned] == [False, True, True]
    assert rows(load(spark, cold.opts(BUCKET, stream="mixed"))) == expected(cold, BUCKET, ["mixed"])

    # The hot path's reads of evicted records go through the same plan.
    opts = ReadOptions.parse(cold.opts(BUCKET))
    mixed = cold.records[(BUCKET, "mixed")]
    lo, hi = mixed[2].pos + 1, mixed[8].pos  # from inside the segment into the slice in pack B
    table = pa.concat_tables(segments_between(opts, "mixed", lo, hi))
    assert b"".join(table["payload"].to_pylist()) == cold.payload(BUCKET, "mixed", lo, hi)
    assert list(starts_between(opts, "mixed", lo, hi)) == [r.pos for r in mixed[3:8]]


def test_a_dead_slice_of_a_same_named_stream_is_not_read(spark: SparkSession, packed: Packed) -> None:
    cold = packed.cold
    (planned,) = plan(cold.opts(BUCKET, stream="ghost"))
    assert (planned.key, planned.group, planned.row) == (packed.b.key, packed.b.placements[3].group,
                                                         packed.b.placements[3].row)  # fmt: skip
    want = expected(cold, BUCKET, ["ghost"])
    assert rows(load(spark, cold.opts(BUCKET, stream="ghost"))) == want
    pushed = load(spark, cold.opts(BUCKET)).filter(F.col("stream") == "ghost")
    assert rows(pushed) == want and pushed.rdd.getNumPartitions() == 1
    everything = load(spark, cold.opts(BUCKET)).select("payload").collect()
    assert not [r for r in everything if bytes(r.payload).startswith(b"old ghost")]


def test_offset_and_time_bounds_prune_slices(spark: SparkSession, packed: Packed) -> None:
    cold = packed.cold
    p1 = cold.records[(BUCKET, "p/1")]  # records 0-2 in pack A, 3-5 in pack B
    cut = format_offset(p1[3].pos)

    def keys(**extra: str) -> list[str]:
        return [p.key for p in plan(cold.opts(BUCKET, stream="p/1", **extra))]

    assert keys() == [packed.a.key, packed.b.key]
    assert keys(from_offset=cut) == [packed.b.key]
    assert keys(to_offset=cut) == [packed.a.key]  # exclusive
    assert keys(start_time=str(LATER)) == [packed.b.key]
    assert keys(end_time=str(LATER)) == [packed.a.key]

    df = load(spark, cold.opts(BUCKET))
    is_p1 = F.col("stream") == "p/1"
    later = F.col("append_time") >= pa.scalar(LATER, pa.timestamp("ms", tz="UTC")).as_py()
    cases = [
        (is_p1 & (F.col("offset") > format_offset(p1[3].pos)), ["p/1"], lambda r: r.pos > p1[3].pos),
        (is_p1 & (F.col("offset") < cut), ["p/1"], lambda r: r.pos < p1[3].pos),
        (later, packed.live(), lambda r: r.time >= LATER),  # every slice in pack A is pruned
    ]
    for cond, streams, keep in cases:
        filtered = df.filter(cond)
        assert filtered.rdd.getNumPartitions() == 1, cond
        assert rows(filtered) == expected(cold, BUCKET, streams, keep), cond


def test_covering_waits_for_a_packed_stream_s_index(packed: Packed, monkeypatch: pytest.MonkeyPatch) -> None:
    opts = ReadOptions.parse(packed.cold.opts(BUCKET))
    p0 = packed.cold.records[(BUCKET, "p/0")]
    only, planned = covering(opts, "p/0", p0[1].pos, p0[4].pos)
    assert [p.key for p in planned] == [packed.a.key, packed.b.key]
    monkeypatch.setattr(planning, "MANIFEST_WAITS", 2)
    monkeypatch.setattr(planning, "MANIFEST_WAIT_SECONDS", 0.0)
    with pytest.raises(FileNotFoundError, match="does not reach"):
        covering(opts, "p/0", 0, _next(p0) + 1)


class CountingStore:
    """A store that counts its GETs (whole and ranged)."""

    def __init__(self, root: Path) -> None:
        self.inner = open_store(root.as_uri())
        self.url = self.inner.url
        self.gets = 0

    def get(self, key: str) -> bytes:
        self.gets += 1
        return self.inner.get(key)

    def get_range(self, key: str, start: int, end: int) -> bytes:
        self.gets += 1
        return self.inner.get_range(key, start, end)

    def list(self, prefix: str) -> Iterator[str]:
        return self.inner.list(prefix)


def test_ten_thousand_packed_streams_plan_quickly_and_read_a_pack_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_store(tmp_path.as_uri())
    names = [f"s/{i:05d}" for i in range(10_000)]
    slices = [packs.Slice(n, "text/plain", [Record(0, BASE_MS + i, f"{n};".encode())]) for i, n in enumerate(names)]
    written = [write_pack(store, "many", slices[:5000]), write_pack(store, "many", slices[5000:])]
    counting = CountingStore(tmp_path)
    opts = ReadOptions.parse({"store": tmp_path.as_uri(), "bucket": "many", "include_hot": "false"})
    monkeypatch.setitem(planning._STORES, (opts.store, opts.s3), counting)

    started = time.perf_counter()
    planned, spans = planning.plan_streams(opts)
    print(f"\nplanned a read of 10,000 packed streams in {time.perf_counter() - started:.3f} s")

    where = {s.stream: (w.key, p.group, p.row) for w, part in zip(written, (slices[:5000], slices[5000:]), strict=True)
             for s, p in zip(part, w.placements, strict=True)}  # fmt: skip
    assert [p.stream for p in planned] == names  # each stream once
    assert all((p.key, p.group, p.row, p.records) == (*where[p.stream], 1) for p in planned)
    assert spans == {n: (0, len(n) + 1) for n in names}

    runs = pack(planned, 0)
    assert [{p.key for p in run} for run in runs] == [{written[0].key}, {written[1].key}]
    counting.gets = 0
    got = {}
    for run in runs:
        for table in planned_tables(opts, run, opts.bounds):
            (row,) = table.select(["stream", "payload"]).to_pylist()
            got[row["stream"]] = row["payload"]
    assert got == {n: f"{n};".encode() for n in names}
    groups = sum(len({p.group for p in w.placements}) for w in written)
    assert counting.gets == len(written) + groups, "a GET for each pack's footer, one for each row group"


def test_a_gap_in_the_catalog_ends_what_the_cold_tier_is_taken_to_hold(tmp_path: Path) -> None:
    """A slice merged into a segment whose manifest is not published yet: what follows the gap is
    left to the server (or to `covering`, which waits), not read around it."""
    store = open_store(tmp_path.as_uri())
    recs = _records("g", 0, 0, 6, BASE_MS)
    first = write_pack(store, "gp", [packs.Slice("g", "text/plain", recs[:2])])
    write_pack(store, "gp", [packs.Slice("g", "text/plain", recs[4:])])  # records 2-3 are nowhere yet
    opts = ReadOptions.parse({"store": tmp_path.as_uri(), "bucket": "gp", "include_hot": "false"})
    planned, spans = planning.plan_streams(opts)
    assert [p.key for p in planned] == [first.key]
    assert spans == {"g": (0, recs[2].pos)}


def test_a_missing_pack_or_a_slice_the_pack_does_not_hold_is_an_error(file_packed: Packed) -> None:
    cold = file_packed.cold
    opts = ReadOptions.parse(cold.opts(BUCKET))
    slice_a, _ = plan(cold.opts(BUCKET, stream="p/1"))

    def read(**change: Any) -> None:
        list(planned_tables(opts, [dataclasses.replace(slice_a, **change)], opts.bounds))

    with pytest.raises(FileNotFoundError, match="is missing"):
        read(key=f"{BUCKET}/!packs/{'0' * 40}.parquet")
    with pytest.raises(ValueError, match="has no rows"):
        read(row=slice_a.row + 10_000)
    with pytest.raises(ValueError, match="has no row group"):
        read(group=99)
    with pytest.raises(ValueError, match="are not p/1's slice"):
        read(row=slice_a.row + 1, records=1)  # an index pointing one row off
    with pytest.raises(ValueError, match="are not p/1's slice"):
        read(records=slice_a.records + 1)  # an index overstating its rows: the next stream's would follow
