"""Flow control for one connection, both ways.

Reading: the connection stops reading once the request body the app has not taken yet passes
HIGH_WATER_LIMIT, and while a pipelined request waits behind the response under way; it reads
again when the app asks for more (`receive`) or the response ends. A client can then hold no more
than that in the server's memory, whatever it sends.

Writing: the transport says when its buffer passes its own high-water mark (`pause_writing`) and
when it has drained (`resume_writing`); the app's `send` waits on `drain()` in between, so a client
that does not read its responses holds one buffer's worth, not everything the app would write.

The connection's read clock (the body timeout and minimum rate) runs only while the server reads:
`on_pause` and `on_resume` tell it. They are called on every request to pause or resume, not only
on a change, because the clock also pauses on its own (a client waiting for 100 Continue).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

# Request body bytes buffered for the app before the connection stops reading.
HIGH_WATER_LIMIT = 65536


def _nothing() -> None:
    pass


class FlowControl:
    __slots__ = ("_transport", "_writable", "_on_pause", "_on_resume", "read_paused", "write_paused")

    def __init__(
        self,
        transport: asyncio.Transport,
        on_pause: Callable[[], None] = _nothing,
        on_resume: Callable[[], None] = _nothing,
    ) -> None:
        self._transport = transport
        self._on_pause = on_pause
        self._on_resume = on_resume
        self.read_paused = False
        self.write_paused = False
        self._writable = asyncio.Event()
        self._writable.set()

    def pause_reading(self) -> None:
        self._on_pause()
        if not self.read_paused:
            self.read_paused = True
            self._transport.pause_reading()

    def resume_reading(self) -> None:
        self._on_resume()
        if self.read_paused:
            self.read_paused = False
            self._transport.resume_reading()

    def pause_writing(self) -> None:
        if not self.write_paused:
            self.write_paused = True
            self._writable.clear()

    def resume_writing(self) -> None:
        if self.write_paused:
            self.write_paused = False
            self._writable.set()

    async def drain(self) -> None:
        """Returns once the transport takes writes again (at once if it does)."""
        await self._writable.wait()
