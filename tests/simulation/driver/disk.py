"""Disks: every store is a `DiskKV`, a MemoryKV that tracks which writes are synced. The driver's
persister is a `Persister`: one job at a time, each finishing after a virtual fsync delay
(sometimes a stall of seconds), instead of a thread. An armed crash strikes around a sync."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import TYPE_CHECKING, Any, TypeVar

from app.storage.kv import Batch, MemoryKV

if TYPE_CHECKING:
    from tests.simulation.driver.process import Member
    from tests.simulation.driver.world import Simulation

T = TypeVar("T")


class DiskKV(MemoryKV):
    """A MemoryKV whose writes are durable only once synced, like RocksDB's write-ahead log."""

    def __init__(self, column_families: list[str]) -> None:
        super().__init__(column_families)
        self.column_families = column_families
        self._durable = MemoryKV(column_families)
        self._unsynced: list[list[Any]] = []

    def write(self, batch: Batch, sync: bool = False) -> None:
        super().write(batch)
        self._unsynced.append(list(batch.ops))
        if sync:
            self.sync_wal()

    def delete_range(self, cf: str, start: bytes, end: bytes, sync: bool = False) -> None:
        batch = Batch()
        batch.delete_range(cf, start, end)
        self.write(batch, sync)

    def sync_wal(self) -> None:
        for ops in self._unsynced:
            self._durable.write(Batch(ops))
        self._unsynced.clear()

    @property
    def unsynced(self) -> int:
        return len(self._unsynced)

    @property
    def durable(self) -> MemoryKV:
        """What a power loss now would leave (apart from a prefix of the unsynced writes)."""
        return self._durable

    def after_crash(self, kept: int) -> DiskKV:
        """What a restart finds: the synced writes and the first `kept` unsynced ones (a WAL prefix)."""
        for ops in self._unsynced[:kept]:
            self._durable.write(Batch(ops))
        self._unsynced.clear()
        disk = DiskKV(self.column_families)
        batch = Batch()
        for cf in self.column_families:
            for key, value in self._durable.scan(cf, b""):
                batch.put(cf, key, value)
        disk.write(batch, sync=True)
        return disk


class Persister(Executor):
    """The driver's persister on virtual time: one job at a time, each after a virtual fsync delay."""

    def __init__(self, sim: Simulation, member: Member) -> None:
        self.sim = sim
        self.member = member
        self._queue: deque[tuple[Callable[..., Any], tuple[Any, ...], Future[Any]]] = deque()
        self._timer: asyncio.TimerHandle | None = None
        self._vote: tuple[int, int] | None = None  # the last (term, vote) submitted

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        assert not kwargs
        fut: Future[T] = Future()
        self._queue.append((fn, args, fut))
        if self._timer is None:
            self._schedule()
        hard_state = args[0] if _is_sync(fn) else None
        vote = (hard_state.term, hard_state.vote) if hard_state is not None and hard_state.vote else None
        if vote is not None and vote != self._vote:  # a vote cast just now
            self._vote = vote
            self._maybe_crash("vote")
        else:
            self._maybe_crash("before")
        return fut

    def _maybe_crash(self, moment: str) -> None:
        """An armed crash strikes while a sync (maybe of a vote) is in flight, or right after one,
        before the loop has seen it done."""
        member, sim = self.member, self.sim
        armed = sim.armed.get(member.id)
        if armed is None or member.current is None or member.current.persister is not self:
            return
        if armed == moment or (armed == "before" and moment == "vote"):
            del sim.armed[member.id]
            member.current.dead = True  # from this instant it sends nothing
            kind = sim.rng.choice(["kill", "power"])
            sim.spawn(sim.crash(member, kind, f"{moment} a sync"))

    def _schedule(self) -> None:
        if not self._queue:
            self._timer = None
            return
        self._timer = asyncio.get_running_loop().call_later(self.sim.disk_delay(), self._next)

    def _next(self) -> None:
        self._run(*self._queue.popleft())
        self._schedule()

    def _run(self, fn: Callable[..., Any], args: tuple[Any, ...], fut: Future[Any]) -> None:
        if not fut.set_running_or_notify_cancel():
            return
        if _is_sync(fn):
            self.sim.stats["syncs"] += 1
            self.sim.stats["entries_synced"] += len(args[1])
            self.sim.stats["largest_sync"] = max(self.sim.stats["largest_sync"], len(args[1]))
        try:
            result = fn(*args)
        except BaseException as exc:
            self.sim.fail(f"a persister job {fn!r} failed: {exc!r}")
            fut.set_exception(exc)
        else:
            fut.set_result(result)
        self._maybe_crash("after")

    def crash(self) -> None:
        """The process died: queued jobs never ran."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for _, _, fut in self._queue:
            fut.cancel()
        self._queue.clear()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        while self._queue:
            job = self._queue.popleft()
            if wait and not cancel_futures:
                self._run(*job)
            else:
                job[2].cancel()


def _is_sync(fn: Callable[..., Any]) -> bool:
    """A log sync: LogStore.save, or the driver's timed call of it (LogSync.save)."""
    return getattr(fn, "__name__", "") == "save"
