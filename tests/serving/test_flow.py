"""Flow control: reading paused and resumed once per change, the read clock told every time, and
`drain` holding the app's writes while the transport is full."""

from __future__ import annotations

import asyncio

from app.serving.flow import HIGH_WATER_LIMIT, FlowControl
from tests.serving.harness import FakeTransport


class Calls:
    def __init__(self) -> None:
        self.paused = self.resumed = 0

    def pause(self) -> None:
        self.paused += 1

    def resume(self) -> None:
        self.resumed += 1


class CountingTransport(FakeTransport):
    def __init__(self) -> None:
        super().__init__()
        self.pauses = self.resumes = 0

    def pause_reading(self) -> None:
        self.pauses += 1
        super().pause_reading()

    def resume_reading(self) -> None:
        self.resumes += 1
        super().resume_reading()


def test_reading_is_paused_and_resumed_once_per_change() -> None:
    async def run() -> None:
        transport = CountingTransport()
        flow = FlowControl(transport)
        flow.resume_reading()  # not paused: nothing to resume
        assert transport.resumes == 0 and not flow.read_paused
        flow.pause_reading()
        flow.pause_reading()
        assert transport.pauses == 1 and transport.paused and flow.read_paused
        flow.resume_reading()
        flow.resume_reading()
        assert transport.resumes == 1 and not transport.paused and not flow.read_paused

    asyncio.run(run())


def test_the_read_clock_is_told_of_every_pause_and_resume() -> None:
    async def run() -> None:
        calls = Calls()
        flow = FlowControl(FakeTransport(), calls.pause, calls.resume)
        flow.resume_reading()  # the app reading while not paused still resumes the clock (100-continue)
        flow.pause_reading()
        flow.pause_reading()
        flow.resume_reading()
        assert (calls.paused, calls.resumed) == (2, 2)

    asyncio.run(run())


def test_drain_waits_while_writing_is_paused() -> None:
    async def run() -> None:
        flow = FlowControl(FakeTransport())
        await asyncio.wait_for(flow.drain(), 1)  # writable: at once
        flow.pause_writing()
        flow.pause_writing()
        assert flow.write_paused
        waiter = asyncio.ensure_future(flow.drain())
        await asyncio.sleep(0.01)
        assert not waiter.done()
        flow.resume_writing()
        await asyncio.wait_for(waiter, 1)
        assert not flow.write_paused
        flow.resume_writing()  # not paused: nothing changes
        await asyncio.wait_for(flow.drain(), 1)

    asyncio.run(run())


def test_the_high_water_mark_is_64_kib() -> None:
    assert HIGH_WATER_LIMIT == 64 * 1024
