"""The faults, until FAULT_SECONDS: partitions (sometimes one-way), crashes (now or armed to strike
around a sync, a vote or a checkpoint install), restarts, drop rates and leadership transfers."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from tests.simulation.driver.config import FAULT_SECONDS
from tests.simulation.driver.process import Unavailable, call

if TYPE_CHECKING:
    from tests.simulation.driver.process import Member
    from tests.simulation.driver.world import Simulation


async def faults(sim: Simulation) -> None:
    network = sim.network
    while True:
        await asyncio.sleep(sim.rng.expovariate(1 / 1.5))
        if sim.now() >= FAULT_SECONDS:
            return
        roll = sim.rng.random()
        members = sorted(sim.members.values(), key=lambda m: m.id)
        if roll < 0.2:
            if network.cut:
                network.cut = set()
                sim.event("heal the network")
            else:
                leader = sim.leader()
                victim = leader.id if leader and sim.rng.random() < 0.5 else sim.rng.choice(members).id
                others = [m.id for m in members if m.id != victim]
                direction = sim.rng.choice(["both", "in", "out"])
                if direction != "in":
                    network.cut |= {(victim, o) for o in others}
                if direction != "out":
                    network.cut |= {(o, victim) for o in others}
                sim.event(f"partition {victim} ({direction})")
        elif roll < 0.45:
            up = [m for m in members if m.current is not None]
            if len(up) > 1:
                doomed = sim.rng.choice(up)
                if sim.rng.random() < 0.5:
                    sim.armed[doomed.id] = sim.rng.choice(["before", "after", "vote", "install"])
                else:
                    await sim.crash(doomed, sim.rng.choice(["stop", "kill", "power"]))
        elif roll < 0.7:
            down = [m for m in members if m.current is None]
            if down:
                sim.boot(sim.rng.choice(down))
        elif roll < 0.8:
            network.drop = sim.rng.choice([0.0, 0.02, 0.1, 0.3])
            sim.event(f"drop rate {network.drop}")
        elif roll < 0.9:
            leader = sim.leader()
            if leader is not None:
                sim.event(f"transfer leadership from {leader.id}")
                sim.stats["transfers"] += 1
                asyncio.ensure_future(transfer(sim, leader))
        # otherwise a quiet spell


async def transfer(sim: Simulation, leader: Member) -> None:
    try:
        moved = await call(leader, lambda raft: raft.transfer_leadership(2.0), 3.0)
        sim.event(f"transfer from {leader.id}: {moved}")
    except Unavailable:
        pass
