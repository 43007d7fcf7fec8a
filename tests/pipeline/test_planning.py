"""Planning a `rill` read from the catalog: the segments it opens, how they pack into partitions, the hot ranges."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql.datasource import EqualTo, GreaterThan, GreaterThanOrEqual, In, IsNull, LessThan, LessThanOrEqual

from app.domain.offsets import format_offset
from app.pipeline import planning
from app.pipeline.options import Bounds, Range, ReadOptions, narrow
from app.pipeline.planning import PlannedSegment, covering, hot_ranges, pack, plan, units
from app.tiering.store import open_store
from tests.pipeline.conftest import Cold, write_stream


def utc(ms: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC)


def test_plan_keeps_exactly_the_segments_touching_the_range(file_cold: Cold) -> None:
    seg = file_cold.manifests[("b1", "orders")].segments
    firsts = [s.first_offset for s in seg]
    boundary = int(seg[1].first_offset[-16:])

    def planned(**extra: str) -> list[str]:
        return [p.first_offset for p in plan(file_cold.opts(stream="orders", **extra))]

    assert planned() == firsts
    assert planned(from_offset=seg[1].first_offset) == firsts[1:]
    assert planned(from_offset=str(boundary - 1)) == firsts  # a bare position works like its token
    assert planned(to_offset=seg[1].first_offset) == firsts[:1]  # exclusive
    assert planned(to_offset=format_offset(boundary + 1)) == firsts[:2]
    assert planned(from_offset=seg[2].next_offset) == []
    assert planned(start_time=str(seg[2].min_append_time)) == firsts[2:]
    assert planned(end_time=str(seg[2].min_append_time)) == firsts[:2]  # exclusive
    assert planned(end_time=str(seg[2].min_append_time + 1)) == firsts
    assert planned(start_time=utc(seg[2].max_append_time + 1).isoformat()) == []
    # A zone in an ISO time is honoured: 01:00+01:00 is midnight UTC, the first time of segment 1.
    assert planned(start_time="2024-03-02T01:00:00+01:00") == firsts[1:]
    keys = [p.key for p in plan(file_cold.opts(stream="orders"))]
    assert keys == [f"b1/orders/{s.path}" for s in seg]


def test_a_prefix_of_dots_finds_the_streams_whose_names_are_dots(tmp_path: Path) -> None:
    store = open_store(tmp_path.as_uri())
    # "." and ".." are no stream's ids; "..." and "...." have directories %2E%2E%2E and %2E%2E%2E%2E.
    for name in ("...", "....", ".x", "x."):
        write_stream(store, "d", name, [1])
    opts = {"store": tmp_path.as_uri(), "bucket": "d", "include_hot": "false"}
    assert [p.stream for p in plan({**opts, "prefix": "."})] == ["...", "....", ".x"]
    assert [p.stream for p in plan({**opts, "prefix": "...."})] == ["...."]


def test_narrow_reads_pushed_filters(file_cold: Cold) -> None:
    seg = file_cold.manifests[("b1", "orders")].segments

    def planned(*filters: Any) -> list[tuple[str, str]]:
        bounds = ReadOptions.parse(file_cold.opts()).bounds
        for f in filters:
            bounds = narrow(bounds, f, "b1")
        return [(p.stream, p.first_offset) for p in plan(file_cold.opts(), bounds)]

    orders = EqualTo(("stream",), "orders")
    firsts = [("orders", s.first_offset) for s in seg]
    # A manifest does not say where a segment's last record starts, so only `next_offset` can rule it out.
    assert planned(orders, GreaterThan(("offset",), seg[0].next_offset)) == firsts[1:]
    assert planned(orders, GreaterThanOrEqual(("offset",), seg[1].next_offset)) == firsts[2:]
    assert planned(orders, LessThan(("offset",), seg[1].first_offset)) == firsts[:1]
    assert planned(orders, LessThanOrEqual(("offset",), seg[1].first_offset)) == firsts[:2]
    assert planned(In(("stream",), ("logsx", "nope"))) == [("logsx", format_offset(0))]
    assert planned(orders, In(("stream",), ("logsx",))) == []  # both must hold
    assert planned(orders, IsNull(("offset",)), GreaterThan(("offset",), 5)) == firsts  # not understood: no pruning
    assert narrow(Bounds(), EqualTo(("bucket",), "b2"), "b1").nothing


def test_pack_spreads_segments_in_runs_of_about_equal_bytes() -> None:
    segs = [PlannedSegment("s", f"k{i}", "", "", 1, size) for i, size in enumerate([10, 10, 10, 10, 100, 10, 10])]

    def runs(max_bytes: int, least: int = 1) -> list[list[int]]:
        return [[int(s.key[1:]) for s in run] for run in pack(segs, max_bytes, least)]

    assert runs(0) == [[i] for i in range(7)]  # the default: a partition per segment
    assert runs(1000) == [list(range(7))]
    assert runs(1000, 2) == [[0, 1, 2, 3], [4, 5, 6]]  # halves by bytes, as near as whole segments allow
    assert runs(80) == [[0, 1, 2, 3], [4, 5, 6]]  # 160 bytes need 2 runs
    assert runs(1000, 100) == [[i] for i in range(7)]  # never more runs than segments
    assert runs(1000, 3) == [[0, 1, 2, 3], [4], [5, 6]]
    assert pack([], 1000, 4) == []


def test_pack_keeps_each_pack_s_slices_in_one_run_and_balances_the_rest() -> None:
    def piece(key: str, group: int, row: int, size: int) -> PlannedSegment:
        return PlannedSegment("s", key, "", "", 1, size, 1000, group, row)

    def own(key: str) -> PlannedSegment:
        return PlannedSegment("s", key, "", "", 1, 100)

    segs = [own("a"), piece("p1", 1, 0, 10), piece("p2", 0, 0, 50), piece("p1", 0, 5, 10), piece("p1", 0, 0, 10)]
    segs += [own("b"), piece("p2", 0, 3, 50)]

    def where(runs: list[list[PlannedSegment]]) -> list[list[tuple[str, int, int]]]:
        return [[(s.key, s.group, s.row) for s in run] for run in runs]

    # A pack's slices go where its first one was, by row group and row: one task and one footer for them.
    slices_of = [[("a", -1, 0)], [("p1", 0, 0), ("p1", 0, 5), ("p1", 1, 0)], [("p2", 0, 0), ("p2", 0, 3)]]
    slices_of.append([("b", -1, 0)])
    assert where(units(segs)) == where(pack(segs, 0)) == slices_of
    assert where(pack(segs, 1000, 2)) == [slices_of[0] + slices_of[1], slices_of[2] + slices_of[3]]  # 130 and 200
    assert where(pack(segs, 1000, 100)) == slices_of  # never more runs than units
    assert where(pack(segs, 1000)) == [[s for unit in slices_of for s in unit]]


def test_hot_ranges_are_what_a_stream_s_segments_do_not_hold() -> None:
    tails = {"a": 100, "b": 50, "c": 30}
    spans = {"a": (10, 60), "b": (0, 50)}  # "c" has no segments yet
    everything = [("a", 0, 10), ("a", 60, 100), ("c", 0, 30)]
    assert hot_ranges(tails, spans, Bounds()) == everything
    assert hot_ranges(tails, spans, Bounds(streams=frozenset({"a"}))) == everything[:2]
    assert hot_ranges(tails, spans, Bounds(offsets=Range(format_offset(70)))) == [("a", 60, 100)]
    assert hot_ranges(tails, spans, Bounds(offsets=Range(hi=format_offset(10)))) == [("a", 0, 10), ("c", 0, 30)]
    assert hot_ranges(tails, spans, Bounds(nothing=True)) == []


def test_covering_waits_for_the_manifest_to_reach_the_range(file_cold: Cold, monkeypatch: pytest.MonkeyPatch) -> None:
    opts = ReadOptions.parse(file_cold.opts())
    seg = file_cold.manifests[("b1", "orders")].segments
    lo, hi = int(seg[1].first_offset[-16:]), int(seg[1].next_offset[-16:])
    only, segments = covering(opts, "orders", lo, hi)
    assert [s.first_offset for s in segments] == [seg[1].first_offset]
    assert only.offsets == Range(format_offset(lo), False, format_offset(hi), True)

    monkeypatch.setattr(planning, "MANIFEST_WAITS", 2)
    monkeypatch.setattr(planning, "MANIFEST_WAIT_SECONDS", 0.0)
    end = int(seg[-1].next_offset[-16:])
    with pytest.raises(FileNotFoundError, match="does not reach"):
        covering(opts, "orders", lo, end + 1)
