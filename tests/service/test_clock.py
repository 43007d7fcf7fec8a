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
        self.wall_ms, self.mono = T, 1000.0
        self.floor = 0

    def advance(self, ms: int) -> None:
        self.wall_ms += ms
        self.mono += ms / 1000

    def clock(self) -> ForwardClock:
        return ForwardClock(lambda: self.floor, lambda: self.wall_ms, lambda: self.mono)


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
    c.wall_ms -= 3_600_000  # an NTP step of an hour back
    c.advance(2000)
    assert clock() == T + 2000
    c.advance(500)
    assert clock() == T + 2500
    c.wall_ms += 3_600_000 + 10_000  # and forward again, past where it was
    assert clock() == c.wall_ms


def test_a_leader_behind_the_last_one_starts_from_the_latest_stamp_applied() -> None:
    c = Clocks()
    clock = c.clock()
    c.floor = T + 5000  # the old leader's clock was 5 s ahead of this node's
    assert clock() == T + 5000
    c.advance(1000)
    assert clock() == T + 6000


def test_a_stream_reported_expired_stays_expired_when_the_clock_steps_back() -> None:
    """A 404 is judged from the clock before the sweep removes the stream: with the raw wall clock, a
    step back (or a new leader behind) served the stream again, took appends, and a create of the same
    name after the 404 got the old stream and its data back."""

    async def run() -> None:
        c = Clocks()
        machine = StateMachine(MemoryKV(records.COLUMN_FAMILIES))
        c.floor = 0
        clock = ForwardClock(lambda: machine.latest_now, lambda: c.wall_ms, lambda: c.mono)
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
