"""`rill bench replication`'s summary: medians per mode, and each round's own ratio to one node."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from app.bench.replication import _summarize


def _run(per_second: float, leader_us: float, follower_us: float = math.nan) -> dict[str, object]:
    return {
        "per_second": per_second,
        "p99_ms": 10.0,
        "leader_cpu_us_per_append": leader_us,
        "follower_cpu_us_per_append": follower_us,
        "leader_core": 0.9,
        "client_cpu": 0.1,
        "errors": {},
    }


def test_ratios_are_the_median_of_each_rounds_own_ratio() -> None:
    rounds = [
        {"single": _run(4000, 200), "http": _run(2000, 400, 140), "channels": _run(3600, 220, 70)},
        {"single": _run(2000, 400), "http": _run(1000, 600, 150), "channels": _run(1800, 440, 75)},
        {"single": _run(3000, 300), "http": _run(1500, 450, 145), "channels": _run(1500, 600, 80)},
    ]
    results = _summarize(rounds)
    assert list(results) == ["3 nodes, channels", "1 node", "3 nodes, HTTP"]
    channels, single = results["3 nodes, channels"], results["1 node"]
    assert channels["per_second"] == 1800 and single["per_second"] == 3000
    # Per round: 1.10, 1.10, 2.00 (CPU) and 0.90, 0.90, 0.50 (throughput): the noisy round is outvoted.
    assert math.isclose(channels["leader_cpu_over_single"], 1.1)
    assert math.isclose(channels["throughput_over_single"], 0.9)
    assert channels["leader_cpu_over_single_by_round"] == "1.10 1.10 2.00"
    assert single["leader_cpu_over_single"] == 1.0
    assert results["3 nodes, HTTP"]["follower_cpu_us_per_append"] == 145


def test_errors_of_every_round_are_added_up() -> None:
    bad = _run(100, 100)
    bad["errors"] = {"http 5xx": 3}
    rounds = [{"single": _run(1, 1), "http": bad, "channels": _run(1, 1)}] * 2
    assert _summarize(rounds)["3 nodes, HTTP"]["errors"] == {"http 5xx": 6}


@pytest.mark.skipif(shutil.which("wrk") is None or shutil.which("taskset") is None, reason="needs wrk and taskset")
def test_a_short_run_measures_every_mode(tmp_path: Path) -> None:
    out = tmp_path / "replication.json"
    cmd = [sys.executable, "-m", "app.cli", "bench", "replication", "--rounds", "1", "--seconds", "1"]
    cmd += ["--warmup", "1", "--json-out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads(out.read_text())["results"]
    for column in results.values():
        assert column["errors"] == {} and column["per_second"] > 0 and column["leader_cpu_us_per_append"] > 0
    assert results["3 nodes, channels"]["follower_cpu_us_per_append"] > 0
