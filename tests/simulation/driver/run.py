"""One seed's run: three nodes boot, the workload, faults and reconfiguration run until FAULT_SECONDS,
then everything heals and the cluster must settle within SETTLE_SECONDS and pass the final checks."""

from __future__ import annotations

import asyncio
import functools
import traceback
from dataclasses import dataclass
from typing import Any

from tests.simulation.driver.checks import check, settled
from tests.simulation.driver.clients import reader, writer
from tests.simulation.driver.config import FAULT_SECONDS, READERS, SETTLE_SECONDS
from tests.simulation.driver.consumers import WORKERS, consumer, patterns, webhook_subscription
from tests.simulation.driver.faults import faults
from tests.simulation.driver.loop import VirtualTimeLoop
from tests.simulation.driver.membership import reconfigure
from tests.simulation.driver.process import Member, task_factory
from tests.simulation.driver.world import Simulation


@dataclass
class Result:
    seed: int
    applied: int  # the final applied index
    digest: str  # of everything delivered and every event: equal digests, equal runs
    virtual_seconds: float
    stats: dict[str, int]


def run_seed(seed: int, verbose: bool = False, join: bool = True) -> Result:
    sim = Simulation(seed, verbose=verbose, join=join)
    with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
        runner.run(run(sim))
        result = Result(seed, sim.applied, sim.trace.hexdigest()[:16], runner.get_loop().time(), dict(sim.stats))
    return result


async def run(sim: Simulation) -> None:
    loop = sim.loop = asyncio.get_running_loop()
    loop.set_task_factory(task_factory)
    loop.set_exception_handler(functools.partial(_loop_error, sim))
    for i in (1, 2, 3):
        sim.members[i] = Member(i, [1, 2, 3])
        sim.boot(sim.members[i])
    workload = [asyncio.ensure_future(writer(sim, c)) for c in sim.clients]
    workload += [asyncio.ensure_future(reader(sim)) for _ in range(READERS)]
    workload += [asyncio.ensure_future(consumer(sim, worker)) for worker in WORKERS]
    workload.append(asyncio.ensure_future(webhook_subscription(sim)))
    workload.append(asyncio.ensure_future(patterns(sim)))
    workload.append(asyncio.ensure_future(faults(sim)))
    if sim.join:
        workload.append(asyncio.ensure_future(reconfigure(sim)))
    for task in workload:
        task.add_done_callback(functools.partial(_workload_done, sim))
    scenario = asyncio.ensure_future(_scenario(sim))
    failed = asyncio.ensure_future(sim.failed.wait())
    await asyncio.wait([scenario, failed], return_when=asyncio.FIRST_COMPLETED)
    if sim.failures:
        raise AssertionError(sim.failures[0])
    scenario.result()
    check(sim)


def _loop_error(sim: Simulation, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    exc = context.get("exception")
    if exc is not None and any(exc is seen for seen in sim.reported):
        return  # a failed driver task, collected: on_failure has told already
    detail = "".join(traceback.format_exception(exc)) if exc is not None else ""
    sim.fail(f"{context.get('message')}: {detail}")


def _workload_done(sim: Simulation, task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        exc = task.exception()
        sim.fail("".join(traceback.format_exception(exc)))


async def _scenario(sim: Simulation) -> None:
    await asyncio.sleep(FAULT_SECONDS)
    sim.healing = True
    sim.network.cut, sim.network.drop, sim.armed = set(), 0.0, {}
    sim.event("heal everything")
    for member in sorted(sim.members.values(), key=lambda m: m.id):
        if member.current is None:
            sim.boot(member)
    deadline = sim.now() + SETTLE_SECONDS
    while sim.now() < deadline:
        await asyncio.sleep(0.5)
        if settled(sim):
            return
    pending = [c.id for c in sim.clients if not c.done]
    raise AssertionError(f"the healed cluster did not settle (clients still waiting: {pending})")
