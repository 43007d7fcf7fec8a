"""The wall clock the service layer reads, injected so that tests run on a fake one, and the clock a
node stamps commands with."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

Clock = Callable[[], int]  # milliseconds since the epoch


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass
class ForwardClock:
    """The time a node stamps on commands and judges expiry by: the wall clock, but never behind the
    latest stamp its state machine applied (`floor`: another leader's) nor behind what it said before.
    A clock stepped back, or a new leader whose clock is behind the old one's, goes on from there at
    the pace of the monotonic clock: time in the log never runs backwards, so a stream reported
    expired stays expired, a sliding TTL is not cut short, and a lease lasts what it says."""

    floor: Callable[[], int]
    wall: Clock = wall_clock_ms
    monotonic: Callable[[], float] = time.monotonic
    _last: int = field(default=0, init=False)
    _at: float = field(default=0.0, init=False)

    def __call__(self) -> int:
        at = self.monotonic()
        now = max(self.wall(), self.floor(), self._last + int((at - self._at) * 1000))
        self._last, self._at = now, at
        return now
