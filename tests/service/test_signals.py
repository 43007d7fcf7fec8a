"""Wake-ups after an apply: a long-poll's wait on one stream, and the fan-out's listener on all."""

from __future__ import annotations

import asyncio

from app.service.signals import Signals


def test_a_waiter_wakes_on_its_stream_only_and_times_out_otherwise() -> None:
    async def scenario() -> None:
        signals = Signals()
        heard: list[set[int]] = []
        signals.listen(heard.append)
        woken = asyncio.ensure_future(signals.wait(1, 5))
        other = asyncio.ensure_future(signals.wait(2, 0.05))
        await asyncio.sleep(0)
        signals.notify({1})
        assert await woken is True
        assert await other is False  # stream 2 never changed
        assert heard == [{1}]
        assert not signals._waiters  # nothing left behind by either

    asyncio.run(scenario())


def test_a_thousand_waiters_on_one_stream_are_all_woken_by_one_notify() -> None:
    async def scenario() -> None:
        signals = Signals()
        waits = [asyncio.ensure_future(signals.wait(7, 5)) for _ in range(1000)]
        await asyncio.sleep(0)
        signals.notify({7, 8})
        assert all(await asyncio.gather(*waits))

    asyncio.run(scenario())
