"""Per-item retry state for the tiering worker: what failed, how often, and when to try it again.

Kept on the leader only (a new leader starts with a clean slate). Delays double from `base` up to
`cap`, shortened by up to `jitter` of themselves at random so many failing streams spread out;
times are ms on the caller's clock, so tests can drive it.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

K = TypeVar("K", bound=Hashable)


@dataclass
class Failure:
    error: str
    attempts: int
    retry_at: int  # ms
    labels: dict[str, str]


class Backoff(Generic[K]):
    def __init__(
        self, base: float = 1.0, cap: float = 300.0, jitter: float = 0.2, rng: random.Random | None = None
    ) -> None:
        self.base, self.cap, self.jitter = base, cap, jitter
        self.rng = rng or random.Random()
        self.failures: dict[K, Failure] = {}

    def ready(self, item: K, now: int) -> bool:
        failure = self.failures.get(item)
        return failure is None or now >= failure.retry_at

    def failed(self, item: K, now: int, error: str, **labels: str) -> Failure:
        previous = self.failures.get(item)
        attempts = previous.attempts + 1 if previous else 1
        delay = min(self.cap, self.base * 2 ** min(attempts - 1, 62))
        delay *= 1 - self.jitter * self.rng.random()
        failure = Failure(error, attempts, now + int(delay * 1000), labels)
        self.failures[item] = failure
        return failure

    def succeeded(self, item: K) -> None:
        self.failures.pop(item, None)

    def keep_only(self, alive: Callable[[K], bool]) -> None:
        """Forgets items that no longer exist."""
        for key in [k for k in self.failures if not alive(k)]:
            del self.failures[key]

    def clear(self) -> None:
        self.failures.clear()

    def report(self, now: int, limit: int = 100) -> list[dict[str, Any]]:
        """The first `limit` failures, soonest retry first, as healthz shows them."""
        soonest = heapq.nsmallest(limit, self.failures.values(), key=lambda f: f.retry_at)
        return [
            {**f.labels, "error": f.error, "attempts": f.attempts, "retry_in_s": max(0, f.retry_at - now) / 1000}
            for f in soonest
        ]
