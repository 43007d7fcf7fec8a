"""app/runtime/blocking.py: each kind of blocking work has its own few threads, so one that hangs queues only
its own calls; shutting down cancels what is queued and waits for nothing."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import get_args

import pytest

from app.runtime import blocking

pytestmark = pytest.mark.anyio


@pytest.fixture()
def release() -> Iterator[threading.Event]:
    """What the calls that stand for stuck work wait for; set at the end whatever happens."""
    event = threading.Event()
    yield event
    event.set()


def thread_name() -> str:
    return threading.current_thread().name


def test_every_kind_has_a_small_pool() -> None:
    assert set(blocking.SIZES) == set(get_args(blocking.Kind))
    assert all(1 <= size <= 4 for size in blocking.SIZES.values())


async def test_each_kind_runs_on_its_own_threads() -> None:
    for kind in get_args(blocking.Kind):
        assert (await blocking.run(kind, thread_name)).startswith(f"rill-{kind}_")
    assert await blocking.run("cold", divmod, 7, 2) == (3, 1)


async def test_a_stuck_kind_holds_only_its_own_threads(release: threading.Event) -> None:
    stuck = [asyncio.ensure_future(blocking.run("jwks", release.wait)) for _ in range(blocking.SIZES["jwks"] + 2)]
    others = [kind for kind in get_args(blocking.Kind) if kind != "jwks"]
    names = await asyncio.wait_for(asyncio.gather(*(blocking.run(kind, thread_name) for kind in others)), 5)
    assert all(name.startswith(f"rill-{kind}_") for name, kind in zip(names, others, strict=True))
    assert not any(task.done() for task in stuck)
    release.set()
    assert await asyncio.wait_for(asyncio.gather(*stuck), 5) == [True] * len(stuck)


async def test_shutdown_cancels_queued_calls_and_waits_for_none(release: threading.Event) -> None:
    size = blocking.SIZES["checkpoints"]
    before = blocking.pool("checkpoints")
    running = [asyncio.ensure_future(blocking.run("checkpoints", release.wait)) for _ in range(size)]
    queued = asyncio.ensure_future(blocking.run("checkpoints", release.wait))
    await asyncio.sleep(0.1)
    await asyncio.wait_for(asyncio.to_thread(blocking.shutdown), 5)  # with its threads still stuck
    with pytest.raises(asyncio.CancelledError):
        await queued
    assert await blocking.run("checkpoints", thread_name)  # a fresh pool
    assert blocking.pool("checkpoints") is not before
    release.set()
    assert await asyncio.wait_for(asyncio.gather(*running), 5) == [True] * size


async def test_the_pools_stay_up_until_the_last_server_stops() -> None:
    """In-process tests run several nodes at once: one stopping must not cancel the others' calls."""
    blocking.start()
    blocking.start()
    try:
        first = blocking.pool("snapshots")
        blocking.shutdown()
        assert blocking.pool("snapshots") is first
        assert await blocking.run("snapshots", thread_name)
    finally:
        blocking.shutdown()
    assert blocking.pool("snapshots") is not first


async def test_settle_waits_for_running_calls_whose_callers_were_cancelled(release: threading.Event) -> None:
    """A stopping node cancels its tasks, but a thread already reading a store runs on: closing the
    store then left it open (and its directory locked) behind the thread. `settle` waits for it."""
    finished = threading.Event()

    def read_store() -> None:
        release.wait()
        finished.set()

    caller = asyncio.ensure_future(blocking.run("tiering", read_store))
    await asyncio.sleep(0.05)
    caller.cancel()
    assert not await blocking.settle(0.1)  # bounded: still running
    threading.Timer(0.2, release.set).start()
    assert await blocking.settle(5)
    assert finished.is_set()
    assert await blocking.settle(0)  # nothing left
