"""What the engine and the HTTP layer count as they serve."""

from __future__ import annotations

from dataclasses import dataclass, field

from app.counters.histogram import Histogram


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
