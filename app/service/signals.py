"""Wake-ups after each apply: long-polls wait on one stream, the SSE fan-out listens to all."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class Signals:
    def __init__(self) -> None:
        self._waiters: dict[int, set[asyncio.Future[None]]] = {}
        self._listeners: list[Callable[[set[int]], None]] = []

    def listen(self, listener: Callable[[set[int]], None]) -> None:
        """Calls `listener` with the changed streams after every apply (the SSE fan-out's hook)."""
        self._listeners.append(listener)

    async def wait(self, sid: int, timeout: float, gone: asyncio.Future[None] | None = None) -> bool:
        """Waits until `sid` changes; False on timeout, or once `gone` (the client left) is done.
        Register before any await, right after checking."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiters = self._waiters.setdefault(sid, set())
        waiters.add(fut)
        try:
            if gone is None:
                async with asyncio.timeout(timeout):
                    await fut
                return True
            await asyncio.wait((fut, gone), timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            return fut.done()
        except TimeoutError:
            return False
        finally:
            waiters.discard(fut)
            if not waiters and self._waiters.get(sid) is waiters:
                del self._waiters[sid]

    def notify(self, sids: set[int]) -> None:
        for listener in self._listeners:
            listener(sids)
        for sid in sids:
            for fut in self._waiters.pop(sid, ()):
                if not fut.done():
                    fut.set_result(None)
