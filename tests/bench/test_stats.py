"""Percentiles and rates behind the benchmark reports."""

from __future__ import annotations

import math

import pytest

from app.bench.stats import Recorder, latency_summary, percentile, rate


def test_nearest_rank_percentiles() -> None:
    values = [float(v) for v in range(1, 101)]  # 1..100
    assert percentile(values, 50) == 50
    assert percentile(values, 90) == 90
    assert percentile(values, 99) == 99
    assert percentile(values, 99.9) == 100
    assert percentile(values, 100) == 100
    assert percentile([7.0], 50) == 7.0


def test_percentile_edges() -> None:
    assert math.isnan(percentile([], 50))
    with pytest.raises(ValueError):
        percentile([1.0], 0)
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_rate() -> None:
    assert rate(500, 2.0) == 250
    assert math.isnan(rate(1, 0))


def test_recorder_counts_errors_apart_from_latencies() -> None:
    rec = Recorder()
    for ms in range(1, 11):
        rec.add(ms / 1000, 204, 100)
    rec.add(0.5, 409, 100)
    rec.add(0.5, 0, 0)
    summary = rec.summary(2.0)
    assert summary["ok"] == 10
    assert summary["per_second"] == 5
    assert summary["mb_per_second"] == pytest.approx(1000 / 2 / 1e6)
    assert summary["p50_ms"] == pytest.approx(5)
    assert summary["max_ms"] == pytest.approx(10)
    assert summary["errors"] == {0: 1, 409: 1}


def test_merge_and_latency_summary() -> None:
    a, b = Recorder(), Recorder()
    a.add(0.001, 200, 1)
    b.add(0.003, 204, 1)
    a.merge(b)
    assert a.ok == 2 and a.bytes_sent == 2
    assert latency_summary([0.001, 0.002, 0.003]) == pytest.approx({"p50_ms": 2.0, "p99_ms": 3.0, "max_ms": 3.0})
