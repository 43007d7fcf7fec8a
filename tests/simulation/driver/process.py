"""A node's process: one run (`Incarnation`) of a `Member`, with its `RaftNode`, persister, checkpoint
link and every task it started; a crash kills them all, and clients' connections to it with them.
A restart is a new incarnation over what the member's disks hold."""

from __future__ import annotations

import asyncio
import contextvars
import sys
import traceback
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from app.cluster import log_store
from app.cluster.driver import RaftNode
from app.cluster.log_store import LogStore
from app.raft.messages import Message
from app.state_machine import records
from tests.simulation.driver.checkpoints import Link
from tests.simulation.driver.checks import Machine, check_durable
from tests.simulation.driver.config import COMPACT_EVERY, COMPACT_KEEP, TICK
from tests.simulation.driver.disk import DiskKV, Persister

if TYPE_CHECKING:
    from tests.simulation.driver.world import Simulation

T = TypeVar("T")

_OWNER: contextvars.ContextVar[Incarnation | None] = contextvars.ContextVar("sim_owner", default=None)


class Unavailable(Exception):
    """A client's call got no answer: it timed out, or the node crashed under it."""


@dataclass
class Member:
    id: int
    voters: list[int]  # the configuration it boots with before it has applied one
    raft_kv: DiskKV = field(default_factory=lambda: DiskKV(log_store.COLUMN_FAMILIES))
    state_kv: DiskKV = field(default_factory=lambda: DiskKV(records.COLUMN_FAMILIES))
    current: Incarnation | None = None
    boots: int = 0


class Incarnation:
    """One run of a node's process: its RaftNode, persister and tasks; all die together."""

    def __init__(self, sim: Simulation, member: Member, number: int) -> None:
        self.sim = sim
        self.member = member
        self.tasks: dict[asyncio.Task[Any], None] = {}
        self.lost: dict[asyncio.Future[None], None] = {}  # clients' connections to this process
        self.dead = False
        self.ctx = contextvars.copy_context()
        self.ctx.run(_OWNER.set, self)
        machine = Machine(member.state_kv, sim, member.id)
        membership = machine.membership
        voters = sorted(membership.voters) if membership else member.voters
        learners = sorted(membership.learners) if membership else []
        self.persister = Persister(sim, member)
        self.link = Link(sim, member, self)
        self.raft = RaftNode(
            member.id,
            voters,
            LogStore(member.raft_kv),
            machine,
            learners=learners,
            send=self.send,
            checkpoints=self.link,
            tick_seconds=TICK,
            seed=sim.seed * 1000 + member.id * 100 + number,
            compact_entries=COMPACT_EVERY,
            compact_keep=COMPACT_KEEP,
            executor=self.persister,
            # Half the runs sync a follower's log on its loop, the rest always on the persister
            # (the virtual disk's delays and the crashes armed around a sync strike only there).
            inline_syncs=(sim.seed + member.id + number) % 2 == 0,
            sync_clock=asyncio.get_running_loop().time,  # virtual: a seed replays the same choices
        )
        self.raft.on_failure = self._failed
        self.spawn(self.raft.start())
        from tests.simulation.driver.webhooks import deliveries  # webhooks -> process: imported when a node boots

        self.deliveries = deliveries(self)
        self.spawn(self.deliveries.run_forever())

    def spawn(self, coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        return asyncio.get_running_loop().create_task(coro, context=self.ctx.copy())

    async def send(self, messages: list[Message]) -> None:
        if self.dead:
            return
        for msg in messages:
            check_durable(self.sim, self.member, msg)
            self.sim.network.post(msg)

    def _failed(self) -> None:
        exc = sys.exc_info()[1]
        if exc is not None:
            self.sim.reported.append(exc)
        self.sim.fail(f"the driver of node {self.member.id} failed:\n{traceback.format_exc()}")

    def kill(self) -> None:
        self.dead = True
        self.persister.crash()
        for task in list(self.tasks):
            task.cancel()
        for lost in self.lost:
            if not lost.done():
                lost.set_result(None)


def task_factory(
    loop: asyncio.AbstractEventLoop, coro: Any, context: contextvars.Context | None = None
) -> asyncio.Task[Any]:
    """Every task belongs to the node incarnation that created it, so a crash can cancel them all."""
    task: asyncio.Task[Any] = asyncio.Task(coro, loop=loop, context=context)
    owner = context.get(_OWNER) if context is not None else _OWNER.get()
    if owner is not None:
        owner.tasks[task] = None
        task.add_done_callback(lambda t: owner.tasks.pop(t, None))
    return task


async def call(member: Member, make: Callable[[RaftNode], Awaitable[T]], timeout: float) -> T:
    """A client's request to a node: its answer, or Unavailable on a timeout or a crash."""
    incarnation = member.current
    if incarnation is None:
        raise Unavailable()
    lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    incarnation.lost[lost] = None
    task = asyncio.ensure_future(make(incarnation.raft))
    try:
        either: list[asyncio.Future[Any]] = [task, lost]
        done, _ = await asyncio.wait(either, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            return task.result()
        raise Unavailable()
    finally:
        incarnation.lost.pop(lost, None)
        if not task.done():
            task.cancel()  # the client gives up, as on a timeout or a dropped connection
