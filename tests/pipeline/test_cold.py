"""Reading the cold tier's segments: a stream's records and where its appends start, over a range of offsets."""

from __future__ import annotations

import dataclasses

import pyarrow as pa
import pytest

from app.domain.offsets import format_offset
from app.pipeline.cold import planned_tables, segments_between, starts_between
from app.pipeline.options import ReadOptions
from app.pipeline.planning import plan, store_for
from tests.pipeline.conftest import Cold


def test_a_range_reads_the_records_starting_in_it_across_segments(cold: Cold) -> None:
    opts = ReadOptions.parse(cold.opts())
    orders = cold.records[("b1", "orders")]  # segments of records 0-9, 10-19, 20-29
    lo, hi = orders[8].pos + 1, orders[21].pos  # from inside record 8 to record 21's start
    table = pa.concat_tables(segments_between(opts, "orders", lo, hi))
    assert b"".join(table["payload"].to_pylist()) == cold.payload("b1", "orders", lo, hi)
    assert list(starts_between(opts, "orders", lo, hi)) == [r.pos for r in orders[9:21]]
    assert list(starts_between(opts, "orders", hi, hi)) == []


def test_a_segment_listed_twice_gives_its_rows_once_and_a_damaged_one_is_named(cold: Cold) -> None:
    """A manifest listing one object under two ranges gave its rows twice: each entry keeps only the
    rows of its own range. A segment that is not Parquet is an error naming it."""
    opts = ReadOptions.parse(cold.opts())
    first = plan(cold.opts(stream="orders"))[0]
    again = dataclasses.replace(first, first_offset=first.next_offset, next_offset=format_offset(10**9))
    table = pa.concat_tables(planned_tables(opts, [first, again], opts.bounds))
    assert table["offset"].to_pylist() == sorted(set(table["offset"].to_pylist()))
    assert table.num_rows == first.records
    store = store_for(opts)
    store.put("b1/cut/segments/x.parquet", store.get(first.key)[:-20])
    with pytest.raises(ValueError, match="b1/cut/segments/x.parquet"):
        list(planned_tables(opts, [dataclasses.replace(first, key="b1/cut/segments/x.parquet")], opts.bounds))
