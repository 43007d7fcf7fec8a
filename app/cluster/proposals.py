"""This node's proposals waiting on the Raft driver: queued until its next step, then waiting for
their entries to apply, each answered once with its entry's outcome, or with why it will have none.

A waiter is keyed by its entry's index and remembers the term it was proposed in: an entry applied
at that index in another term is not this proposal's, which was dropped (another leader replaced it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from app.cluster.driver_errors import ProposalDropped
from app.raft.messages import Entry


class Proposals:
    def __init__(self) -> None:
        self.queued: list[tuple[bytes, asyncio.Future[Any], Any]] = []  # proposed since the last step
        self.waiting: dict[int, tuple[int, asyncio.Future[Any]]] = {}  # index -> (term, caller)
        # Proposals the caller also gave decoded, by index: their apply skips decoding.
        self._decoded: dict[int, tuple[bytes, Any]] = {}

    def queue(self, data: bytes, decoded: Any) -> asyncio.Future[Any]:
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.queued.append((data, fut, decoded))
        return fut

    def take(self) -> list[tuple[bytes, asyncio.Future[Any], Any]]:
        """The queued proposals, but those whose callers gave up (cancelled) meanwhile."""
        queued, self.queued = self.queued, []
        return [proposal for proposal in queued if not proposal[1].done()]

    def wait(self, index: int, term: int, fut: asyncio.Future[Any], data: bytes = b"", decoded: Any = None) -> None:
        """Resolves `fut` when entry `index` applies. A waiter already there is for an entry another
        leader cut from this node's log before this node led again: that proposal was dropped."""
        old = self.waiting.get(index)
        if old is not None and not old[1].done():
            old[1].set_exception(ProposalDropped())
        self.waiting[index] = (term, fut)
        if decoded is not None:
            self._decoded[index] = (data, decoded)

    def decoded(self, entries: list[Entry]) -> dict[int, Any]:
        """What this node proposed among `entries`, decoded: the entries that are the very bytes it proposed."""
        mine, known = self._decoded, {}
        if mine:
            for entry in entries:
                given = mine.pop(entry.index, None)
                if given is not None and given[0] is entry.data:
                    known[entry.index] = given[1]
        return known

    def applied(self, entries: list[Entry], results: list[Any]) -> None:
        for entry, result in zip(entries, results, strict=True):
            waiter = self.waiting.pop(entry.index, None)
            if waiter is None or waiter[1].done():
                continue
            if waiter[0] == entry.term:
                waiter[1].set_result(result)
            else:
                waiter[1].set_exception(ProposalDropped())

    def cut_after(self, last: int) -> None:
        """A new leader cut this node's log to `last`: the entries of its proposals past it are gone
        for good (the log only shrinks where it disagrees with the leader's), so their callers hear
        it now rather than when the log grows past them again, which an idle cluster may never do."""
        if self.waiting and max(self.waiting) > last:
            self._fail([i for i in self.waiting if i > last], ProposalDropped)

    def installed(self, index: int) -> None:
        """A checkpoint up to `index` was installed: the outcomes of the proposals in it cannot be
        read, so their callers retry (idempotent producers make that safe)."""
        self._fail([i for i in self.waiting if i <= index], ProposalDropped)
        self._decoded = {i: mine for i, mine in self._decoded.items() if i > index}

    def fail(self, error: Callable[[], Exception], after: int = -1) -> None:
        """Fails the queued proposals and those waiting on entries past `after` with `error()`."""
        self._fail([i for i in self.waiting if i > after], error)
        for _, fut, _ in self.queued:
            if not fut.done():
                fut.set_exception(error())
        self.queued, self._decoded = [], {}

    def _fail(self, indexes: list[int], error: Callable[[], Exception]) -> None:
        for index in indexes:
            fut = self.waiting.pop(index)[1]
            if not fut.done():
                fut.set_exception(error())
