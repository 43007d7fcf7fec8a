"""The network: every message is encoded, then dropped, delayed, duplicated or reordered;
partitions cut nodes off, sometimes in one direction only."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from app.raft.messages import AppendEntries, Message, decode_message, encode

if TYPE_CHECKING:
    from tests.simulation.driver.world import Simulation


class Network:
    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.cut: set[tuple[int, int]] = set()  # (src, dst) pairs the network does not connect
        self.drop = 0.02

    def reachable(self, src: int, dst: int) -> bool:
        return (src, dst) not in self.cut

    def post(self, msg: Message) -> None:
        sim = self.sim
        if isinstance(msg, AppendEntries):
            sim.leaders.setdefault(msg.term, set()).add(msg.src)
        if sim.rng.random() < self.drop:
            return
        raw = encode(msg)
        loop = asyncio.get_running_loop()
        for _ in range(2 if sim.rng.random() < 0.02 else 1):
            slow = sim.rng.random() < 0.05
            loop.call_later(sim.rng.uniform(0.02, 0.4) if slow else sim.rng.uniform(0.0005, 0.015), self.deliver, raw)

    def deliver(self, raw: bytes) -> None:
        sim = self.sim
        msg = decode_message(raw)
        member = sim.members.get(msg.dst)
        if member is None or member.current is None or not self.reachable(msg.src, msg.dst):
            return
        sim.stats["messages"] += 1
        sim.trace.update(raw)
        member.current.raft.receive(msg)
