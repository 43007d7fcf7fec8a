"""`rill bench chores` builds its state and runs the real passes: every idle stream's record ends up
in the object store, a state backup is taken both ways, and each row reports what the tables print."""

from __future__ import annotations

import os
import shutil

import pytest

from app.bench import chores


def test_the_chores_bench_runs_the_real_passes_over_the_streams_it_builds() -> None:
    rows = chores.run_chores([0, 300])
    assert [row["streams"] for row in rows] == [chores.BUSY, 300 + chores.BUSY]
    assert all(row["idle_bytes_untiered"] == 0 for row in rows), "the first pass tiered every idle stream"
    assert all(row["tiering_pass_ms"] > 0 and row["expiry_sweep_ms"] >= 0 for row in rows)
    for label in ("thread", "child"):  # a backup of the same state each way, the loop's lag measured
        assert all(row[f"backup_{label}_s"] > 0 for row in rows)
        assert all(0 <= row[f"backup_{label}_lag_p99_ms"] <= row[f"backup_{label}_lag_max_ms"] for row in rows)


@pytest.mark.skipif(shutil.which("wrk") is None, reason="needs wrk (apt-get install wrk)")
def test_the_served_variant_creates_idle_streams_then_appends_without_errors() -> None:
    cpus = os.sched_getaffinity(0)
    row = chores.served(1, append_seconds=1.0)
    assert row["idle_streams"] > 100 and row["per_second"] > 0 and row["errors"] == {}
    assert os.sched_getaffinity(0) == cpus, "the caller's CPUs are given back"
