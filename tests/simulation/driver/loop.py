"""Virtual time: an asyncio loop whose clock moves only when nothing is ready, straight to the next
timer. Ticks, timeouts and delays cost no wall time."""

from __future__ import annotations

import asyncio
import selectors


class Stalled(RuntimeError):
    """Nothing is ready and no timer is set: the simulation would wait forever."""


class _VirtualSelector(selectors.DefaultSelector):
    """Polls for real I/O (the loop's self-pipe) without blocking; a wait jumps the clock instead."""

    loop: VirtualTimeLoop

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        events = super().select(0)
        if events or timeout == 0:
            return events
        if timeout is None:
            raise Stalled("nothing is scheduled")
        self.loop.advance(timeout)
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop on virtual time: when nothing is ready, time jumps to the next timer."""

    def __init__(self) -> None:
        self._now = 0.0
        selector = _VirtualSelector()
        selector.loop = self
        super().__init__(selector)

    def time(self) -> float:
        return self._now

    def advance(self, timeout: float) -> None:
        scheduled: list[asyncio.TimerHandle] = self._scheduled  # type: ignore[attr-defined]
        # Land exactly on the next timer (no float drift); `timeout` is the distance to it.
        self._now = max(self._now, scheduled[0].when()) if scheduled else self._now + timeout
