"""Group commit of the Raft log (app/cluster/log_sync.py): merging, one sync in flight, where it runs."""

from __future__ import annotations

import asyncio
import errno
from concurrent.futures import ThreadPoolExecutor

import pytest

from app.cluster import log_store
from app.cluster.log_store import LogStore
from app.cluster.log_sync import INLINE_SYNC_SECONDS, LogSync, Unsaved
from app.raft.messages import AppendResponse, Entry, HardState
from app.raft.ready import Ready
from app.storage.disk import OutOfSpace
from app.storage.kv import MemoryKV


def _ack(index: int) -> AppendResponse:
    return AppendResponse(src=2, dst=1, term=1, success=True, match_index=index)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0
        self.step = 0.0  # how long each save takes: the clock moves this much between two reads

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def _sync(
    executor: ThreadPoolExecutor, clock: FakeClock | None = None, inline: bool = True
) -> tuple[LogSync, list[int]]:
    wakes: list[int] = []
    store = LogStore(MemoryKV(log_store.COLUMN_FAMILIES))
    sync = LogSync(store, executor, lambda: wakes.append(1), inline=inline, clock=clock or FakeClock())
    return sync, wakes


def test_a_later_ready_replaces_the_suffix_it_overlaps_and_keeps_the_latest_hard_state() -> None:
    unsaved = Unsaved()
    assert not unsaved
    unsaved.add(Ready(hard_state=HardState(term=1), entries=[Entry(1, i, b"a") for i in (1, 2, 3)]))
    unsaved.add(Ready(hard_state=HardState(term=2), entries=[Entry(2, 2, b"b")], messages=[_ack(2)]))
    assert unsaved.hard_state == HardState(term=2)
    assert [(e.index, e.term) for e in unsaved.entries] == [(1, 1), (2, 2)]
    assert unsaved.messages == [_ack(2)]
    assert unsaved


def test_what_becomes_ready_during_a_sync_goes_into_the_next_one_with_its_messages_held() -> None:
    async def scenario() -> None:
        with ThreadPoolExecutor(max_workers=1) as executor:
            sync, wakes = _sync(executor)
            sync.unsaved.add(Ready(entries=[Entry(1, 1, b"x")], messages=[_ack(1)]))
            sync.start()
            assert sync.busy
            assert sync.hold([_ack(0)])  # an acknowledgement waits for the sync in flight
            sync.unsaved.add(Ready(entries=[Entry(1, 2, b"y")]))
            sync.start()  # one sync at a time: this waits
            assert [e.index for e in sync.unsaved.entries] == [2]
            await sync.settle()
            assert wakes  # the driver is woken when the persister is done
            batch = sync.finished()
            assert batch is not None
            assert [e.index for e in batch.entries] == [1]
            assert batch.messages == [_ack(1), _ack(0)]
            assert sync.finished() is None  # given once
            assert not sync.hold([]) and sync.busy  # none in flight, and entry 2 still waits
            sync.start()
            await sync.settle()
            assert sync.finished() is not None and not sync.busy
            assert [e.index for e in sync.log_store.entries()] == [1, 2]
            assert not sync.hold([_ack(2)])  # nothing in flight: the caller sends it now

    asyncio.run(scenario())


def test_a_follower_syncs_on_its_loop_until_a_sync_is_slow_and_a_leader_never_does() -> None:
    async def scenario() -> None:
        clock = FakeClock()
        with ThreadPoolExecutor(max_workers=1) as executor:
            sync, _ = _sync(executor, clock)
            assert not sync.syncs_here(leader=True)
            assert sync.syncs_here(leader=False)
            clock.step = INLINE_SYNC_SECONDS * 2
            sync.unsaved.add(Ready(entries=[Entry(1, 1, b"x")], messages=[_ack(1)]))
            batch = sync.sync_here()
            assert batch.messages == [_ack(1)] and not sync.unsaved
            assert sync.log_store.last_index == 1
            assert not sync.syncs_here(leader=False)  # that one was slow: the next goes to the persister
            clock.step = 0.0
            sync.unsaved.add(Ready(entries=[Entry(1, 2, b"y")]))
            sync.start()
            assert not sync.syncs_here(leader=False)  # never beside a sync in flight
            await sync.settle()
            assert sync.finished() is not None
            assert sync.syncs_here(leader=False)  # a quick write brings syncs back to the loop

    asyncio.run(scenario())


def test_a_node_told_not_to_sync_on_its_loop_never_does() -> None:
    with ThreadPoolExecutor(max_workers=1) as executor:
        sync, _ = _sync(executor, inline=False)
        assert not sync.syncs_here(leader=False)


def test_a_sync_that_fails_for_want_of_space_raises_out_of_space_once_its_batch_is_asked_for() -> None:
    async def scenario() -> None:
        with ThreadPoolExecutor(max_workers=1) as executor:
            sync, _ = _sync(executor)

            def full(*_: object) -> None:
                raise OSError(errno.ENOSPC, "No space left on device")

            sync.log_store.save = full  # type: ignore[method-assign]
            sync.unsaved.add(Ready(entries=[Entry(1, 1, b"x")], messages=[_ack(1)]))
            sync.start()
            await sync.settle()
            with pytest.raises(OutOfSpace):
                sync.finished()
            assert not sync.hold([])  # the failed sync is no longer in flight
            sync.unsaved.add(Ready(entries=[Entry(1, 1, b"x")]))
            with pytest.raises(OutOfSpace):
                sync.sync_here()
            # The driver starts over on the store reopened: what was not synced is dropped.
            sync.unsaved.add(Ready(entries=[Entry(1, 1, b"lost")]))
            sync.reset(LogStore(MemoryKV(log_store.COLUMN_FAMILIES)))
            assert not sync.busy
            sync.unsaved.add(Ready(entries=[Entry(1, 1, b"x")]))
            sync.sync_here()
            assert [e.data for e in sync.log_store.entries()] == [b"x"]

    asyncio.run(scenario())
