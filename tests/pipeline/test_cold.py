"""Reading the cold tier's segments: a stream's records and where its appends start, over a range of offsets."""

from __future__ import annotations

import pyarrow as pa

from app.pipeline.cold import segments_between, starts_between
from app.pipeline.options import ReadOptions
from tests.pipeline.conftest import Cold


def test_a_range_reads_the_records_starting_in_it_across_segments(cold: Cold) -> None:
    opts = ReadOptions.parse(cold.opts())
    orders = cold.records[("b1", "orders")]  # segments of records 0-9, 10-19, 20-29
    lo, hi = orders[8].pos + 1, orders[21].pos  # from inside record 8 to record 21's start
    table = pa.concat_tables(segments_between(opts, "orders", lo, hi))
    assert b"".join(table["payload"].to_pylist()) == cold.payload("b1", "orders", lo, hi)
    assert list(starts_between(opts, "orders", lo, hi)) == [r.pos for r in orders[9:21]]
    assert list(starts_between(opts, "orders", hi, hi)) == []
