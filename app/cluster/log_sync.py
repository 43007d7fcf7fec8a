"""Group commit of the Raft log: what became ready waits here for the next synced write.

At most one sync runs at a time, on the persister thread, and the loop keeps serving while it runs
(the sync releases the GIL). Whatever becomes ready meanwhile is merged and goes into the next sync
as one batch. A batch's messages go out only once its sync is done: votes and acknowledgements must
never outrun the disk.

A follower whose disk is quick syncs on its loop instead, before it applies anything: the leader's
commit waits on its acknowledgement, and the three hand-offs between threads (each behind whatever
the loop is applying) took longer than the fsync itself. A sync that took longer than
INLINE_SYNC_SECONDS sends the next ones to the persister, until one is quick again, so a slow disk
holds a follower's reads up for one sync at most.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field

from app.cluster.log_store import LogStore
from app.counters.histogram import Histogram
from app.raft.messages import Entry, HardState, Message
from app.raft.ready import Ready
from app.storage.disk import out_of_space

INLINE_SYNC_SECONDS = 0.002  # a follower syncs on its loop while its last sync took at most this


@dataclass
class Unsaved:
    """Readys waiting for the next sync, merged: latest hard state, entries in log order, messages."""

    hard_state: HardState | None = None
    entries: list[Entry] = field(default_factory=list)
    messages: list[Message] = field(default_factory=list)

    def add(self, rd: Ready) -> None:
        if rd.hard_state is not None:
            self.hard_state = rd.hard_state
        if rd.entries:
            first = rd.entries[0].index
            # A later Ready may replace a suffix (a follower truncating a divergent tail).
            self.entries = [e for e in self.entries if e.index < first] + rd.entries
        self.messages += rd.messages

    def __bool__(self) -> bool:
        return self.hard_state is not None or bool(self.entries) or bool(self.messages)


class LogSync:
    def __init__(
        self,
        log_store: LogStore,
        persister: Executor,
        wake: Callable[[], None],
        *,
        inline: bool = True,
        clock: Callable[[], float],
    ) -> None:
        self.log_store = log_store
        self._persister = persister
        self._wake = wake  # the driver's: a sync on the persister is done
        self._inline = inline
        self._clock = clock  # a simulation's is virtual: its disk's delays are the persister's
        self.unsaved = Unsaved()  # ready to persist, waiting for the sync in flight
        self._syncing: tuple[asyncio.Future[float], Unsaved] | None = None
        self._last_seconds = 0.0  # how long the last sync's write took
        self.fsync = Histogram()  # for /metrics: one thread adds, scrapes read

    @property
    def busy(self) -> bool:
        """Whether anything is being synced or waits to be."""
        return self._syncing is not None or bool(self.unsaved)

    def hold(self, messages: list[Message]) -> bool:
        """Has `messages` go out after the sync in flight (an acknowledgement may cover entries it is
        still writing); False if none is."""
        if self._syncing is None:
            return False
        self._syncing[1].messages.extend(messages)
        return True

    def syncs_here(self, leader: bool) -> bool:
        """A leader serves requests while its log syncs, so it hands each sync to the persister; a
        follower has nothing better to do than acknowledge, and syncs on its loop while its disk is
        quick."""
        return self._inline and self._syncing is None and not leader and self._last_seconds <= INLINE_SYNC_SECONDS

    def sync_here(self) -> Unsaved:
        """Syncs what is unsaved on the loop; the batch, whose messages may go now."""
        batch, self.unsaved = self.unsaved, Unsaved()
        with out_of_space():
            self._last_seconds = self.save(batch.hard_state, batch.entries)
        return batch

    def start(self) -> None:
        """Hands what is unsaved to the persister, unless a sync is in flight (it waits for the next)."""
        if self._syncing is not None or not self.unsaved:
            return
        batch, self.unsaved = self.unsaved, Unsaved()
        fut = asyncio.get_running_loop().run_in_executor(self._persister, self.save, batch.hard_state, batch.entries)
        fut.add_done_callback(self._synced)
        self._syncing = (fut, batch)

    def finished(self) -> Unsaved | None:
        """The batch whose sync on the persister is done, once; raises what a failed sync raised."""
        if self._syncing is None or not self._syncing[0].done():
            return None
        fut, batch = self._syncing
        self._syncing = None
        with out_of_space():
            fut.result()  # a failed sync stops the driver (out of space: until it can write): nothing is acknowledged
        return batch

    async def settle(self) -> None:
        """Waits for the sync in flight to end, whether or not it succeeds."""
        if self._syncing is not None:
            await asyncio.wait([self._syncing[0]])

    def reset(self, log_store: LogStore) -> None:
        """Starts over on `log_store` (reopened after a full disk), dropping what was not synced."""
        self.log_store, self.unsaved = log_store, Unsaved()

    def save(self, hard_state: HardState | None, entries: list[Entry]) -> float:
        """One synced write (on the persister thread, or a follower's loop); the seconds it took."""
        started = self._clock()
        self.log_store.save(hard_state, entries)
        seconds = self._clock() - started
        self.fsync.observe(seconds)
        return seconds

    def _synced(self, fut: asyncio.Future[float]) -> None:
        # The write's own time, not the hand-offs': a follower under load goes back to syncing on
        # its loop as soon as its disk is quick again.
        if not fut.cancelled() and fut.exception() is None:
            self._last_seconds = fut.result()
        self._wake()
