"""The driver simulation (tests/simulation/driver/): real RaftNodes on virtual time, over many seeds.

A failing seed replays exactly: python -m tests.simulation.driver --seed N -v
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any

import pytest

from app.cluster import log_store
from app.cluster.driver import RaftNode
from app.cluster.driver_errors import NotLeader
from app.cluster.driver_types import Send
from app.cluster.log_store import LogStore
from app.raft.messages import AppendEntries, AppendResponse, Entry, Message, ReadIndex, ReadIndexResponse
from app.state_machine import records
from app.state_machine.machine import StateMachine
from app.storage.kv import Batch, MemoryKV
from tests.simulation.driver import run_seed
from tests.simulation.driver.checks import Machine
from tests.simulation.driver.disk import DiskKV
from tests.simulation.driver.loop import VirtualTimeLoop
from tests.simulation.seeds import check_driver_seed, failures

SEEDS = 100  # about 0.4 s each
BATCH = 25


@pytest.mark.parametrize("first", range(0, SEEDS, BATCH), ids=lambda first: f"seeds-{first}-{first + BATCH - 1}")
def test_seeds(seed_pool: Executor, first: int) -> None:
    failed = failures(seed_pool, check_driver_seed, range(first, first + BATCH))
    assert not failed, "\n".join(failed)


def test_a_seed_replays_exactly() -> None:
    first, second = run_seed(3), run_seed(3)
    assert first == second
    # Faults and recovery were exercised, through the driver's own paths.
    assert first.stats["crashes"] > 0 and first.stats["installs"] > 0
    assert first.stats["largest_sync"] > 1  # group commit: one sync for several entries


def test_the_simulation_catches_a_state_store_that_never_syncs(monkeypatch: pytest.MonkeyPatch) -> None:
    # Compaction trusts make_durable: without it a power loss leaves the state behind the log.
    monkeypatch.setattr(Machine, "make_durable", lambda self: None)
    for seed in range(20):
        try:
            run_seed(seed)
        except AssertionError as exc:
            assert "applies" in str(exc) or "acknowledged" in str(exc), exc
            return
    pytest.fail("no seed noticed lost state")


def test_virtual_time_costs_no_wall_time() -> None:
    async def scenario() -> float:
        loop = asyncio.get_running_loop()
        await asyncio.sleep(3600)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(asyncio.Event().wait(), 60)
        return loop.time()

    started = time.perf_counter()
    with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
        assert runner.run(scenario()) == 3660
    assert time.perf_counter() - started < 1


def test_a_power_loss_keeps_synced_writes_and_a_prefix_of_the_rest() -> None:
    kv = DiskKV(["cf"])
    for i, sync in enumerate([False, True, False, False, False]):
        batch = Batch()
        batch.put("cf", b"k%d" % i, b"v")
        kv.write(batch, sync=sync)
    assert kv.unsynced == 3
    after = kv.after_crash(kept=1)
    assert [k for k, _ in after.scan("cf", b"")] == [b"k0", b"k1", b"k2"]
    assert after.unsynced == 0


class HeldDisk(Executor):
    """A persister whose syncs finish only when released."""

    def __init__(self) -> None:
        self.jobs: list[tuple[Callable[..., Any], tuple[Any, ...], Future[Any]]] = []

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        fut: Future[Any] = Future()
        self.jobs.append((fn, args, fut))
        return fut

    def release(self) -> None:
        jobs, self.jobs = self.jobs, []
        for fn, args, fut in jobs:
            fut.set_result(fn(*args))


def _driver(
    node_id: int,
    voters: list[int],
    executor: Executor,
    send: Send | None = None,
    inline_syncs: bool = False,
    sync_clock: Callable[[], float] = time.perf_counter,
) -> RaftNode:
    """A driver on in-memory stores whose ticks never come (the test steps it); its follower syncs go
    through `executor` too unless `inline_syncs`."""
    log = LogStore(MemoryKV(log_store.COLUMN_FAMILIES))
    machine = StateMachine(MemoryKV(records.COLUMN_FAMILIES))
    return RaftNode(
        node_id,
        voters,
        log,
        machine,
        send=send,
        tick_seconds=100,
        seed=1,
        executor=executor,
        inline_syncs=inline_syncs,
        sync_clock=sync_clock,
    )


class InstantDisk(HeldDisk):
    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        fut = super().submit(fn, *args)
        self.release()
        return fut


class CountingDisk(InstantDisk):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        self.count += 1
        return super().submit(fn, *args)


def test_a_follower_acknowledges_only_what_it_has_synced() -> None:
    # Found by the simulation (seed 135 before the fix): a heartbeat arriving while a follower's
    # entries were still syncing was answered at once, acknowledging them before they were durable.
    async def scenario() -> None:
        sent: list[Message] = []

        async def send(messages: list[Message]) -> None:
            sent.extend(messages)

        disk = HeldDisk()
        node = _driver(2, [1, 2, 3], disk, send)
        await node.start()
        node.receive(AppendEntries(1, 1, 2, 0, 0, [Entry(1, 1, b"")], 0))
        await asyncio.sleep(0.01)
        assert disk.jobs and not sent  # syncing entry 1
        node.receive(AppendEntries(1, 1, 2, 1, 1, [], 0))  # a heartbeat meanwhile
        await asyncio.sleep(0.01)
        assert not sent, f"acknowledged before the sync finished: {sent}"
        disk.release()
        await asyncio.sleep(0.01)
        matches = [m.match_index for m in sent if isinstance(m, AppendResponse) and m.success]
        assert matches == [1, 1]
        disk.release()
        await node.stop()

    with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
        runner.run(scenario())


def test_a_follower_with_a_quick_disk_syncs_and_acknowledges_before_it_applies() -> None:
    # The leader's commit waits on this acknowledgement: it must not wait behind the thread hand-offs,
    # nor behind applying what the same message committed.
    async def scenario() -> None:
        applied_when_sent: list[tuple[int, int]] = []
        disk = HeldDisk()  # a sync handed to the persister would never finish

        async def send(messages: list[Message]) -> None:
            for m in messages:
                if isinstance(m, AppendResponse) and m.success:
                    applied_when_sent.append((m.match_index, node.core.applied))

        node = _driver(2, [1, 2, 3], disk, send, inline_syncs=True)
        await node.start()
        node.receive(AppendEntries(1, 1, 2, 0, 0, [Entry(1, 1, b"")], 0))
        await asyncio.sleep(0.01)
        node.receive(AppendEntries(1, 1, 2, 1, 1, [Entry(1, 2, b"")], 1))  # entry 2, and 1 committed
        await asyncio.sleep(0.01)
        assert not disk.jobs
        assert applied_when_sent == [(1, 0), (2, 0)]  # 2 acknowledged before 1 was applied
        assert node.core.applied == 1
        assert node.log_store.kv.get(log_store.LOG_CF, (2).to_bytes(8, "big")) is not None
        await node.stop()

    with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
        runner.run(scenario())


def test_a_follower_whose_sync_was_slow_hands_the_next_to_the_persister_until_one_is_quick() -> None:
    async def scenario() -> None:
        acks: list[int] = []

        async def send(messages: list[Message]) -> None:
            acks.extend(m.match_index for m in messages if isinstance(m, AppendResponse) and m.success)

        disk = CountingDisk()
        now = [0.0]
        node = _driver(2, [1, 2, 3], disk, send, inline_syncs=True, sync_clock=lambda: now[0])
        save = node.log_store.save

        def slow_once(*args: Any) -> None:
            now[0] += 0.05  # the loop was held this long
            node.log_store.save = save  # type: ignore[method-assign]
            save(*args)

        node.log_store.save = slow_once  # type: ignore[method-assign]
        await node.start()
        for index in (1, 2, 3):
            node.receive(AppendEntries(1, 1, 2, index - 1, index - 1 and 1, [Entry(1, index, b"")], 0))
            await asyncio.sleep(0.01)
        assert acks == [1, 2, 3]
        assert disk.count == 1  # 1 on the loop (slow), 2 on the persister (quick), 3 on the loop again
        await node.stop()

    with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
        runner.run(scenario())


def test_a_follower_goes_back_to_its_loop_once_a_write_is_quick_however_long_the_hand_off_took() -> None:
    # Under load the persister's answer reaches the loop late: that wait is not the disk's.
    async def scenario() -> None:
        acks: list[int] = []

        async def send(messages: list[Message]) -> None:
            acks.extend(m.match_index for m in messages if isinstance(m, AppendResponse) and m.success)

        disk = HeldDisk()
        now = [0.0]
        node = _driver(2, [1, 2, 3], disk, send, inline_syncs=True, sync_clock=lambda: now[0])
        node._log._last_seconds = 0.05  # the last write was slow
        await node.start()
        node.receive(AppendEntries(1, 1, 2, 0, 0, [Entry(1, 1, b"")], 0))
        await asyncio.sleep(0.01)
        assert len(disk.jobs) == 1 and acks == []
        await asyncio.sleep(0.05)  # the hand-off back takes long; the write itself took no time
        disk.release()
        await asyncio.sleep(0.01)
        node.receive(AppendEntries(1, 1, 2, 1, 1, [Entry(1, 2, b"")], 0))
        await asyncio.sleep(0.01)
        assert acks == [1, 2] and disk.jobs == []  # entry 2 was synced on the loop
        await node.stop()

    with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
        runner.run(scenario())


def test_a_proposal_given_up_as_leadership_is_lost_does_not_kill_the_driver() -> None:
    # A caller cancelled (a timeout, a dropped connection) after proposing, while a newer leader's
    # message deposes this one, in the same loop iteration: the driver failed the cancelled
    # future with NotLeader, raising InvalidStateError, and died.
    async def scenario() -> None:
        node = _driver(1, [1], InstantDisk())
        failed: list[bool] = []
        node.on_failure = lambda: failed.append(True)
        await node.start()  # a single voter leads at once
        caller = asyncio.ensure_future(node.propose(b""))
        await asyncio.sleep(0)
        node.receive(AppendEntries(5, 2, 1, 0, 0, [], 0))
        caller.cancel()
        await asyncio.sleep(0.01)
        assert not failed and not node.is_leader
        await node.stop()

    with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
        runner.run(scenario())


def test_a_read_on_a_node_that_knows_no_leader_yet_waits_for_one() -> None:
    # A node just started (or mid-election) answered a read 503 at once, though a leader was known to
    # the others and would reach it within a heartbeat; the read now waits for one within its deadline.
    async def scenario() -> None:
        sent: list[Message] = []

        async def send(messages: list[Message]) -> None:
            sent.extend(messages)

        node = _driver(3, [1, 2, 3], InstantDisk(), send)
        await node.start()
        read = asyncio.ensure_future(node.read_barrier(timeout=3.0))
        await asyncio.sleep(0.3)
        assert not read.done() and not [m for m in sent if isinstance(m, ReadIndex)]
        node.receive(AppendEntries(1, 1, 3, 0, 0, [Entry(1, 1, b"")], 1))  # leader 1 is heard from
        for _ in range(20):
            await asyncio.sleep(0.05)
            if asked := [m for m in sent if isinstance(m, ReadIndex)]:
                break
        assert asked and asked[-1].dst == 1
        node.receive(ReadIndexResponse(1, 1, 3, asked[-1].ctx, 1))
        await asyncio.wait_for(read, 1.0)
        await node.stop()

    with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
        runner.run(scenario())


def test_a_read_with_no_leader_for_its_whole_deadline_fails() -> None:
    async def scenario() -> None:
        async def send(messages: list[Message]) -> None:
            pass

        node = _driver(3, [1, 2, 3], InstantDisk(), send)
        await node.start()
        started = asyncio.get_running_loop().time()
        with pytest.raises(NotLeader):
            await node.read_barrier(timeout=1.0)
        assert 0.9 <= asyncio.get_running_loop().time() - started <= 1.0
        await node.stop()

    with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
        runner.run(scenario())


def test_a_node_that_is_no_member_does_not_wait_for_a_leader() -> None:
    # A node removed from the cluster hears from no leader again: each read and write held 3 s for nothing.
    async def scenario() -> None:
        async def send(messages: list[Message]) -> None:
            pass

        node = _driver(4, [1, 2, 3], InstantDisk(), send)
        await node.start()
        try:
            started = asyncio.get_running_loop().time()
            with pytest.raises(NotLeader):
                await node.read_barrier(timeout=3.0)
            await node.until_leader_known(timeout=3.0)
            assert asyncio.get_running_loop().time() - started < 0.1
        finally:
            await node.stop()

    with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
        runner.run(scenario())


def test_a_follower_asks_again_when_its_read_index_goes_unanswered() -> None:
    # A ReadIndex lost on the way (a peer connection closed while idle) left the read waiting until
    # its deadline, then 503: the follower now asks again within the read's deadline.
    async def scenario() -> None:
        sent: list[Message] = []

        async def send(messages: list[Message]) -> None:
            sent.extend(messages)

        node = _driver(2, [1, 2, 3], InstantDisk(), send)
        await node.start()
        node.receive(AppendEntries(1, 1, 2, 0, 0, [], 0))  # leader 1 is known
        await asyncio.sleep(0.01)
        started = asyncio.get_running_loop().time()
        read = asyncio.ensure_future(node.read_barrier(timeout=3.0))
        await asyncio.sleep(0.01)
        asked = [m for m in sent if isinstance(m, ReadIndex)]
        assert len(asked) == 1  # and it is lost
        for _ in range(20):  # one second
            await asyncio.sleep(0.05)
            asked = [m for m in sent if isinstance(m, ReadIndex)]
            if len(asked) > 1:
                break
        assert len(asked) == 2, "not asked again within a second"
        node.receive(AppendEntries(1, 1, 2, 0, 0, [Entry(1, 1, b"")], 1))
        node.receive(ReadIndexResponse(1, 1, 2, asked[-1].ctx, 1))
        await asyncio.wait_for(read, 1.0)
        assert asyncio.get_running_loop().time() - started < 1.0
        await node.stop()

    with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
        runner.run(scenario())
