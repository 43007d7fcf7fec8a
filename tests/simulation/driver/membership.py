"""Membership: midway a fourth node joins as a learner, is promoted, and an original voter leaves."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

from app.cluster.driver import RaftNode
from app.cluster.driver_errors import MembershipRefused, NotLeader, ProposalDropped
from app.raft.messages import Membership
from tests.simulation.driver.config import JOIN_AT
from tests.simulation.driver.process import Member, Unavailable, call

if TYPE_CHECKING:
    from tests.simulation.driver.world import Simulation


async def reconfigure(sim: Simulation) -> None:
    """Node 4 joins as a learner, is promoted once caught up, then an original voter leaves."""
    await asyncio.sleep(JOIN_AT)
    sim.members[4] = Member(4, [1, 2, 3])
    sim.boot(sim.members[4])

    def join(m: Membership) -> Membership:
        return Membership(m.voters, {**m.learners, 4: ""})

    await change(sim, lambda m: 4 in m.voters or 4 in m.learners, join)

    def promote(m: Membership) -> Membership:
        return Membership({**m.voters, 4: ""}, {k: v for k, v in m.learners.items() if k != 4})

    await change(sim, lambda m: 4 in m.voters, promote, catch_up=4)
    await asyncio.sleep(5.0)
    while True:
        leader = sim.leader()
        if leader is not None:
            break
        await asyncio.sleep(0.2)
    victim = min(v for v in (1, 2, 3) if v != leader.id)
    sim.removed = victim
    await change(
        sim, lambda m: victim not in m.voters, lambda m: Membership({k: v for k, v in m.voters.items() if k != victim})
    )
    sim.reconfigured = True
    sim.event(f"reconfigured: node 4 in, node {victim} out")


async def change(
    sim: Simulation, done: Callable[[Membership], bool], make: Callable[[Membership], Membership], catch_up: int = 0
) -> None:
    """Proposes `make(current)` through the leader until `done(current)` (waiting for `catch_up` first)."""
    while True:
        leader = sim.leader()
        if leader is not None and leader.current is not None:
            raft = leader.current.raft
            status = raft.status()
            current = raft.machine.membership or Membership(dict.fromkeys(status.voters, ""))
            if done(current):
                return
            if not catch_up or status.match.get(catch_up, 0) >= status.commit:
                new = make(current)
                sim.event(f"propose {new}")
                with contextlib.suppress(NotLeader, MembershipRefused, ProposalDropped, Unavailable):
                    await call(leader, functools.partial(RaftNode.change_membership, new=new), 3.0)
        await asyncio.sleep(0.3)
