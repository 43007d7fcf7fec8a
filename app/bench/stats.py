"""Latency and rate statistics for the benchmark reports."""

from __future__ import annotations

import math
import resource
from collections import Counter
from dataclasses import dataclass, field

PERCENTILES = (50.0, 90.0, 99.0, 99.9)


def percentile(sorted_values: list[float], pct: float) -> float:
    """Nearest-rank percentile of already sorted values (the smallest value with pct% at or below it)."""
    if not sorted_values:
        return math.nan
    if not 0 < pct <= 100:
        raise ValueError("percentile must be in (0, 100]")
    rank = math.ceil(pct / 100 * len(sorted_values))
    return sorted_values[max(rank, 1) - 1]


@dataclass
class Recorder:
    """Request outcomes inside the measurement window: latencies (seconds) and statuses."""

    latencies: list[float] = field(default_factory=list)
    statuses: Counter[int] = field(default_factory=Counter)
    bytes_sent: int = 0

    def add(self, latency: float, status: int, size: int) -> None:
        self.statuses[status] += 1
        if 200 <= status < 300:
            self.latencies.append(latency)
            self.bytes_sent += size

    def merge(self, other: Recorder) -> None:
        self.latencies += other.latencies
        self.statuses.update(other.statuses)
        self.bytes_sent += other.bytes_sent

    @property
    def ok(self) -> int:
        return len(self.latencies)

    @property
    def errors(self) -> dict[int, int]:
        return {status: n for status, n in sorted(self.statuses.items()) if not 200 <= status < 300}

    def summary(self, seconds: float) -> dict[str, float | dict[int, int]]:
        lat = sorted(self.latencies)
        out: dict[str, float | dict[int, int]] = {
            "ok": self.ok,
            "per_second": rate(self.ok, seconds),
            "mb_per_second": rate(self.bytes_sent, seconds) / 1e6,
        }
        for pct in PERCENTILES:
            out[f"p{pct:g}_ms"] = percentile(lat, pct) * 1000
        out["max_ms"] = (lat[-1] if lat else math.nan) * 1000
        out["errors"] = self.errors
        return out


def client_cpu() -> float:
    """CPU seconds (user and system) this process has used: the load generator's own cost."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def rate(count: float, seconds: float) -> float:
    return count / seconds if seconds > 0 else math.nan


def latency_summary(values: list[float]) -> dict[str, float]:
    """p50/p99/max (ms) of latencies in seconds."""
    lat = sorted(values)
    return {
        "p50_ms": percentile(lat, 50) * 1000,
        "p99_ms": percentile(lat, 99) * 1000,
        "max_ms": (lat[-1] if lat else math.nan) * 1000,
    }
