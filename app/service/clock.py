"""The wall clock the service layer reads, injected so that tests run on a fake one."""

from __future__ import annotations

import time
from collections.abc import Callable

Clock = Callable[[], int]  # milliseconds since the epoch


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000
