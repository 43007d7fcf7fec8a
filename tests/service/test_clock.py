"""The clock a node stamps commands with (app/service/clock.py): never behind what the log holds."""

from __future__ import annotations

import asyncio

import pytest

from app.cluster import log_store
from app.cluster.driver import RaftNode
from app.cluster.log_store import LogStore
from app.domain.errors import ProtocolError
from app.service.clock import ForwardClock
from app.service.engine import Engine
from app.service.limits import Limits
from app.service.signals import Signals
from app.state_machine import records
from app.state_machine.commands import Append, Code, CreateBucket, CreateStream
from app.state_machine.machine import StateMachine
from app.storage.kv import MemoryKV

T = 1_800_000_000_000


class Clocks:
    """A wall clock the test sets and steps, and a monotonic one that only moves forward with it."""

    def __init__(self) -> None:
        self.wall_ms, self.mono_ns = T, 10**12
        self.floor = 0

    def advance(self, ms: float) -> None:
        self.wall_ms += int(ms)
        self.mono_ns += int(ms * 1_000_000)

    def clock(self) -> ForwardClock:
        return ForwardClock(lambda: self.floor, lambda: self.wall_ms, lambda: self.mono_ns)


def test_it_is_the_wall_clock_while_that_runs_forward() -> None:
    c = Clocks()
    clock = c.clock()
    assert clock() == T
    c.advance(1500)
    assert clock() == T + 1500


def test_a_clock_stepped_back_goes_on_from_where_it_was() -> None:
    c = Clocks()
    clock = c.clock()
    assert clock() == T
    c.advance(1000)
    c.wall_ms -= 3000  # an NTP step back, found at the next call: time stands there, then runs on
    assert clock() == T
    c.advance(500)
    assert clock() == T + 500
    c.advance(1500)
    assert clock() == T + 2000
    c.wall_ms += 3000 + 10_000  # and forward again, past where it was
    assert clock() == c.wall_ms


def test_called_more_often_than_every_millisecond_it_still_runs() -> None:
    """Each call counted whole milliseconds and dropped the rest: called every 0.1 ms, a clock going on
    from where it was (the wall clock behind) stood still."""
    c = Clocks()
    clock = c.clock()
    clock()
    c.wall_ms -= 4000
    for _ in range(10_000):
        c.mono_ns += 100_000  # 0.1 ms; the wall clock, behind, moves with it
        c.wall_ms = T - 4000 + (c.mono_ns - 10**12) // 1_000_000
        last = clock()
    assert last == T + 999  # from the first call that found the wall clock behind


def test_a_leader_behind_the_last_one_starts_from_the_latest_stamp_applied() -> None:
    c = Clocks()
    clock = c.clock()
    c.floor = T + 3000  # the old leader's clock was 3 s ahead of this node's
    assert clock() == T + 3000
    c.advance(1000)
    assert clock() == T + 4000


def test_a_stamp_far_ahead_does_not_hold_the_clock_ahead(caplog: pytest.LogCaptureFixture) -> None:
    """One leader's clock a day ahead put its stamps in every log; going on from them for good would
    expire every stream a day early until real time caught up. Past 5 s, the wall clock wins."""
    c = Clocks()
    clock = c.clock()
    c.floor = T + 86_400_000
    assert clock() == T
    assert "behind the log's time" in caplog.text
    c.wall_ms -= 3_600_000  # a step back of an hour: the wall clock too
    assert clock() == T - 3_600_000


def test_a_stream_reported_expired_stays_expired_when_the_clock_steps_back() -> None:
    """A 404 is judged from the clock before the sweep removes the stream: with the raw wall clock, a
    step back (or a new leader behind) served the stream again, took appends, and a create of the same
    name after the 404 got the old stream and its data back."""

    async def run() -> None:
        c = Clocks()
        machine = StateMachine(MemoryKV(records.COLUMN_FAMILIES))
        c.floor = 0
        clock = ForwardClock(lambda: machine.latest_now, lambda: c.wall_ms, lambda: c.mono_ns)
        node = RaftNode(1, [1], LogStore(MemoryKV(log_store.COLUMN_FAMILIES)), machine, tick_seconds=0.01, seed=1)
        engine = Engine(node, machine, Signals(), Limits(), clock=clock)
        await node.start()
        try:
            await engine.submit(CreateBucket("b"))
            ends = T + 10_000
            await engine.submit(CreateStream("b", "abs", "text/plain", False, expires_at=ends))
            await engine.submit(Append("b", "abs", "text/plain", memoryview(b"old")))
            c.advance(10_001)
            with pytest.raises(ProtocolError) as gone:
                engine.find("b", "abs")
            assert gone.value.status == 404
            c.wall_ms -= 3000
            with pytest.raises(ProtocolError):
                engine.find("b", "abs")
            made = await engine.submit(CreateStream("b", "abs", "text/plain", False, expires_at=ends + 60_000))
            assert made.code is Code.CREATED
            assert engine.find("b", "abs").tail == 0
        finally:
            await node.stop()

    asyncio.run(run())
