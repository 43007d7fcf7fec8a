"""`rill bench packing` on a few streams: both servers get them, and the table says what each wrote."""

from __future__ import annotations

from app.bench.packing import PackingOptions, run_packing


def test_packing_bench_compares_objects_planning_and_cold_reads() -> None:
    results = run_packing(PackingOptions(streams=60, append_bytes=16, reads=10, writers=2))
    packed, own = results["packed"], results["own segments"]
    assert own["objects"] == 2 * 60  # a segment and a manifest each
    assert packed["objects"] == 2  # one pack and its index
    assert all(row[key] > 0 for row in (packed, own) for key in ("cold_read_p50_ms", "cold_read_p99_ms", "plan_s"))
