"""Counters and histograms as plain numbers, cheap enough for the hot path.

The code that does the work bumps these; nothing here locks or formats. `/metrics` reads them when
it is scraped (app/observability/metrics.py), so a request pays for an add, not for a client library.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

# Seconds: from a fast in-memory answer to a slow object-store upload.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Histogram:
    """Observations counted into fixed buckets (upper bounds, exclusive of +Inf), with their sum."""

    __slots__ = ("bounds", "counts", "count", "total")

    def __init__(self, bounds: tuple[float, ...] = LATENCY_BUCKETS) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.count = 0
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.count += 1
        self.total += value

    def cumulative(self) -> list[tuple[str, int]]:
        """Prometheus's buckets: (upper bound, observations at or below it), ending with +Inf."""
        out, running = [], 0
        for bound, n in zip((*(repr(b) for b in self.bounds), "+Inf"), self.counts, strict=True):
            running += n
            out.append((bound, running))
        return out


@dataclass
class WriteCounters:
    """What the node's engine counts as it serves: appends it acknowledged and bytes it read."""

    appends: int = 0
    appended_bytes: int = 0
    read_bytes: int = 0


@dataclass
class RequestCounters:
    """HTTP requests by (family, method, status), their latency by (family, method), live readers by mode."""

    requests: dict[tuple[str, str, int], int] = field(default_factory=dict)
    latency: dict[tuple[str, str], Histogram] = field(default_factory=dict)
    live: dict[str, int] = field(default_factory=lambda: {"sse": 0, "long_poll": 0})

    def finished(self, family: str, method: str, status: int, seconds: float | None) -> None:
        key = (family, method, status)
        self.requests[key] = self.requests.get(key, 0) + 1
        if seconds is not None:
            histogram = self.latency.get((family, method))
            if histogram is None:
                histogram = self.latency[(family, method)] = Histogram()
            histogram.observe(seconds)
