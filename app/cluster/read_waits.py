"""Linearizable reads waiting on the Raft driver: the requests since its last step (asked as one
ReadIndex), the ReadIndexes not answered yet, and the reads waiting for the applied index to reach
their answer."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from app.cluster.driver_errors import NotLeader


class ReadWaits:
    def __init__(self, first_ctx: int = 0) -> None:
        self.requests: list[asyncio.Future[int]] = []  # asked since the last step
        self._asked: dict[int, list[asyncio.Future[int]]] = {}  # a ReadIndex's ctx -> the requests it answers
        self._ctx = first_ctx
        self._applying: list[tuple[int, asyncio.Future[None]]] = []  # (index, read) waiting for the apply

    def request(self, loop: asyncio.AbstractEventLoop) -> asyncio.Future[int]:
        """A read's request for the commit index, answered by the next ReadIndex."""
        fut: asyncio.Future[int] = loop.create_future()
        self.requests.append(fut)
        return fut

    def ask(self, read_index: Callable[[int], bool]) -> None:
        """Asks one ReadIndex for every request since the last (`read_index(ctx)`: False when this
        node cannot ask, having no leader)."""
        requests, self.requests = self.requests, []
        self._ctx += 1
        if read_index(self._ctx):
            self._asked[self._ctx] = requests
            # Requests whose answer was lost time out; forget them.
            for ctx in [c for c, futs in self._asked.items() if all(f.done() for f in futs)]:
                del self._asked[ctx]
        else:
            for fut in requests:
                if not fut.done():
                    fut.set_exception(NotLeader(0))

    def answer(self, ctx: int, index: int, leader: int) -> None:
        """A ReadIndex's answer: the commit index to wait for, or 0 when the leader refused it."""
        for fut in self._asked.pop(ctx, []):
            if fut.done():
                continue
            if index:
                fut.set_result(index)
            else:
                fut.set_exception(NotLeader(leader))

    def until_applied(self, loop: asyncio.AbstractEventLoop, index: int) -> asyncio.Future[None]:
        ready: asyncio.Future[None] = loop.create_future()
        self._applying.append((index, ready))
        return ready

    def applied(self, applied: int) -> None:
        if self._applying:
            for upto, ready in self._applying:
                if upto <= applied and not ready.done():
                    ready.set_result(None)
            self._applying = [(i, w) for i, w in self._applying if not w.done()]

    def fail(self) -> None:
        """Fails every read waiting (NotLeader: the caller retries, here or elsewhere)."""
        reads: list[asyncio.Future[Any]] = [*self.requests, *(f for fs in self._asked.values() for f in fs)]
        for read in reads + [ready for _, ready in self._applying]:
            if not read.done():
                read.set_exception(NotLeader(0))
        self.requests, self._asked, self._applying = [], {}, []
