"""`rill bench replication`'s summary: medians per mode, and each round's own ratio to one node."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest

from app.bench.replication import ReplicationOptions, _one, _summarize


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
def test_a_short_round_on_channels_measures_the_leader_and_the_followers(tmp_path: Path) -> None:
    """One mode of one round (the suite's time is short): three nodes, pinned, loaded by wrk."""
    measured = _one("channels", ReplicationOptions(seconds=1, warmup=1), tmp_path)
    assert measured["errors"] == {} and measured["per_second"] > 0
    assert measured["leader_cpu_us_per_append"] > 0 and measured["follower_cpu_us_per_append"] > 0
    assert list(tmp_path.iterdir()) == []  # the nodes' data is removed
