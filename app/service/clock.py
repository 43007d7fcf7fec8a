"""The wall clock the service layer reads, injected so that tests run on a fake one, and the clock a
node stamps commands with."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

Clock = Callable[[], int]  # milliseconds since the epoch

log = logging.getLogger("rill.server")
MAX_LEAD_MS = 5_000  # how far the log's time may run ahead of this node's wall clock


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class ForwardClock:
    """The time a node stamps on commands and judges expiry by: the wall clock, but not behind the
    latest stamp its state machine applied (`floor`: another leader's) nor behind what it said before,
    by up to `max_lead` ms. A clock stepped back, or a new leader whose clock is a little behind the
    old one's, goes on from there at the monotonic clock's pace, so time in the log does not run
    backwards: a stream answered 404 for its expiry stays gone, and a lease lasts what it says. Past
    `max_lead` the wall clock wins (logged): one stamp from a clock far ahead must not hold every node
    ahead until real time catches up. Nodes' clocks must agree within it anyway (README)."""

    def __init__(
        self,
        floor: Callable[[], int],
        wall: Clock = wall_clock_ms,
        monotonic_ns: Callable[[], int] = time.monotonic_ns,
        max_lead: int = MAX_LEAD_MS,
    ) -> None:
        self.floor, self.wall, self.monotonic_ns, self.max_lead = floor, wall, monotonic_ns, max_lead
        self._last = 0  # the time returned last
        self._at: int | None = None  # the monotonic time `_last` stands for, once the wall clock is behind
        self._warned = 0

    def __call__(self) -> int:
        wall, floor = self.wall(), self.floor()
        if wall >= self._last and wall >= floor:  # the usual case: the wall clock leads
            self._last, self._at = wall, None
            return wall
        return self._behind(wall, floor)

    def _behind(self, wall: int, floor: int) -> int:
        at = self.monotonic_ns()
        if self._at is None:
            self._at = at
        ran = (at - self._at) // 1_000_000
        ahead = max(floor, self._last + ran)
        if ahead <= wall or ahead - wall > self.max_lead:
            if ahead > wall and wall - self._warned >= 60_000:
                self._warned = wall
                log.warning("the clock is %.1f s behind the log's time: going back to it", (ahead - wall) / 1000)
            self._last, self._at = wall, None
            return wall
        if ahead > self._last + ran:  # the log's floor leads: go on from it
            self._last, self._at = ahead, at
        else:  # whole milliseconds, the remainder kept for the next call
            self._last, self._at = ahead, self._at + ran * 1_000_000
        return ahead
