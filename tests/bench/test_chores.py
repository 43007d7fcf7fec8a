"""`rill bench chores` builds its state and runs the real passes: every idle stream's record ends up
in the object store, and each row reports what the table prints."""

from __future__ import annotations

from app.bench import chores


def test_the_chores_bench_runs_the_real_passes_over_the_streams_it_builds() -> None:
    rows = chores.run_chores([0, 300])
    assert [row["streams"] for row in rows] == [chores.BUSY, 300 + chores.BUSY]
    assert all(row["idle_bytes_untiered"] == 0 for row in rows), "the first pass tiered every idle stream"
    assert all(row["tiering_pass_ms"] > 0 and row["expiry_sweep_ms"] >= 0 for row in rows)
