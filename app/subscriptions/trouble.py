"""The leader's trouble delivering to subscriptions: what failed, how often, when it retries.

Shared by the deliveries, which record failures, and the engine, which reports them on a
subscription's GET; neither needs the other to exist first.
"""

from __future__ import annotations

import random
from typing import Any

from app.tiering.backoff import Backoff


class DeliveryTrouble:
    def __init__(self, rng: random.Random | None = None) -> None:
        self.backoff: Backoff[bytes] = Backoff(1.0, 60.0, 0.2, rng)  # webhook posts
        self.wake_backoff: Backoff[bytes] = Backoff(1.0, 300.0, 0.2, rng)  # wakes the apply could not write

    def status(self, key: bytes, now_ms: int) -> dict[str, Any] | None:
        """The last error delivering to a subscription (by key), its attempts and when it retries."""
        failure = self.backoff.failures.get(key) or self.wake_backoff.failures.get(key)
        if failure is None:
            return None
        retry = max(0, failure.retry_at - now_ms) / 1000
        return {"error": failure.error, "attempts": failure.attempts, "retry_in_s": retry}
